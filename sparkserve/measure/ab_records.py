"""An A/B campaign's records: what it plans (drafters, cells, rounds, order) and what each wave banked. Pure.

Example::

    spec = CampaignSpec(drafters=[Arm(name="A", source="/d/a", digest="…"), …], cells=[CELLS["smoke"], …],
                        rounds=2, seed=7, prompts_source="builtin:…", prompts_sha256="…", config_sha256="…")
    spec.order                          # [Slot(round=0, drafter="B"), Slot(0, "A"), Slot(1, "A"), Slot(1, "B")]
    wave = Wave.of(result, outcomes, slot=2, round=1, drafter="A", boot_row=5, pins=pins)
    wave.excluded                       # None, or why the wave is not counted (restart, contamination, …)

Two designs (``CampaignSpec.design``, chosen and recorded before the first boot):

* ``sequential`` (the default; campaigns from before it were all this): one stack (replica 1 of a
  ``replicas: N`` config) boots the drafters in turn, interleaved ABBA-style: every pair of rounds draws one
  seeded permutation and runs it forwards, then backwards, so no drafter always boots first (a warm node, a
  cold cache) or last.
* ``crossed`` (``replicas: N`` with N ≥ the drafters): every round boots each drafter on a replica of its own
  and benches them at the same time; the next round rotates them (A on 1 and B on 2, then A on 2 and B on 1),
  so over a multiple of the drafters' count in rounds every drafter meets every replica once per cycle and a
  replica's own speed cancels in the delta. The first round's placement is drawn from the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from sparkserve.errors import BadInput
from sparkserve.measure.records import CELLS, BenchResult, Cell, RequestOutcome

#: The default verdict rule: the primary cell's output tok/s, TIE when the 95 % interval spans 0 or the
#: delta is inside the noise floor.
DEFAULT_PRIMARY = "c16"
DEFAULT_METRIC = "output_tok_s"
METRICS = ("output_tok_s", "acceptance_length")
SEQUENTIAL, CROSSED = "sequential", "crossed"
DESIGNS = (SEQUENTIAL, CROSSED)


class Arm(BaseModel):
    """One arm of the campaign: its name (``A``), its drafter's local directory, manifest digest and where it
    lives on every node once synced. A variant (``--variant NAME=KEY=VALUE…``, issue 42) also keeps its
    settings and the fingerprint of the full config they make; its drafter is the config's own (``source``
    and ``digest`` empty: whatever the nodes hold at ``node_path``) unless it sets ``drafter=PATH``, and none at
    all (every field empty) for the MTP head."""

    name: str
    source: str
    digest: str
    node_path: str
    settings: dict[str, Any] = Field(default_factory=dict)  # a variant's KEY=VALUE; empty: a drafter arm
    fingerprint: str | None = None  # a variant's config fingerprint (Config.fingerprint of the config it boots)

    @property
    def is_variant(self) -> bool:
        return self.fingerprint is not None


class CellSpec(BaseModel):
    """A cell as the campaign runs it (the card's sizes, or smaller ones given with ``--size``)."""

    name: str
    prompts: int
    concurrency: int
    max_tokens: int

    def cell(self) -> Cell:
        k = CELLS[self.name].k if self.name in CELLS else None  # c16-k4 keeps its K check at any size
        return Cell(self.name, prompts=self.prompts, concurrency=self.concurrency, max_tokens=self.max_tokens, k=k)

    def shape(self) -> str:
        return f"{self.prompts}×c{self.concurrency}×{self.max_tokens}"


class Rule(BaseModel):
    """The verdict rule, stated: candidate vs baseline on ``primary``'s ``metric``; KEEP when the 95 %
    interval of the relative delta lies above 0, REVERT when below, TIE when it spans 0 or the delta is inside
    the cell's noise floor (:func:`sparkserve.measure.ab_stats.noise_floor`)."""

    baseline: str
    primary: str
    metric: str = DEFAULT_METRIC

    def text(self) -> str:
        what = "output tok/s" if self.metric == "output_tok_s" else "acceptance length"
        return (f"each drafter vs {self.baseline} on the {self.primary} cell's {what}: KEEP when the 95 % interval "
                f"of the relative delta lies above 0, REVERT (to {self.baseline}) when it lies below, TIE when it "
                "spans 0 or the delta is inside the noise floor (1 %, or for tok/s the widest boot-to-boot spread "
                "of one drafter on that cell when larger)")


@dataclass(frozen=True)
class Slot:
    """One planned boot: which round, which drafter, and (crossed design) on which replica."""

    round: int
    drafter: str
    replica: int | None = None


class CampaignSpec(BaseModel):
    """Everything a campaign fixes before its first boot; the journal keeps it and ``--resume`` reads it back."""

    drafters: list[Arm]
    cells: list[CellSpec]
    rounds: int
    seed: int
    prompts_source: str
    prompts_sha256: str
    config_sha256: str
    rule: Rule
    bootstrap: int = 2000
    sampling: dict[str, object] = Field(default_factory=dict)
    design: str = SEQUENTIAL  # or CROSSED (campaigns from before the choice existed were sequential)
    tuning: str | None = None  # `sparkserve tune`: the dotted field the arms differ in (None: `ab run`)

    @property
    def order(self) -> list[Slot]:
        names = [a.name for a in self.drafters]
        if self.design == CROSSED:
            return crossed_order(names, self.rounds, self.seed)
        return interleaved_order(names, self.rounds, self.seed)

    def design_text(self) -> str:
        """The design in words, as `ab report` states it."""
        if self.design == CROSSED:
            n = len(self.drafters)
            return (f"crossed over on {n} replicas: each round benches every drafter at the same time, each on a "
                    f"replica of its own, and the next round rotates them (seed {self.seed}), so a replica's own "
                    "speed cancels")
        return f"sequential: one stack boots the drafters in turn, interleaved order (seed {self.seed})"

    def arm(self, name: str) -> Arm:
        return next(a for a in self.drafters if a.name == name)


def interleaved_order(names: list[str], rounds: int, seed: int) -> list[Slot]:
    """The boots, round by round: per pair of rounds one seeded permutation, forwards then backwards (ABBA)."""
    rng = random.Random(seed)
    out: list[Slot] = []
    perm: list[str] = []
    for r in range(rounds):
        if r % 2 == 0:
            perm = list(names)
            rng.shuffle(perm)
            seq = perm
        else:
            seq = list(reversed(perm))
        out += [Slot(r, n) for n in seq]
    return out


def crossed_order(names: list[str], rounds: int, seed: int) -> list[Slot]:
    """The crossed design's boots, round by round: in round r drafter i of a seeded permutation runs on replica
    ``(i + r) mod n + 1`` (n drafters on replicas 1..n; a Latin square over n rounds). Within a round the slots
    are listed by replica; they boot and bench at the same time."""
    perm = list(names)
    random.Random(seed).shuffle(perm)
    n = len(perm)
    out: list[Slot] = []
    for r in range(rounds):
        placed = sorted(((i + r) % n + 1, name) for i, name in enumerate(perm))
        out += [Slot(r, name, replica) for replica, name in placed]
    return out


def parse_size(text: str) -> CellSpec:
    """``c16=8x16x128`` (prompts × concurrency × max tokens) → that cell's size; BadInput otherwise."""
    name, sep, dims = text.partition("=")
    if not sep or name not in CELLS:
        raise BadInput("--size", f"{text!r}: expected CELL=PROMPTSxCONCURRENCYxTOKENS with CELL one of "
                       f"{', '.join(CELLS)}")
    try:
        p, c, t = (int(x) for x in dims.lower().replace("×", "x").split("x"))
    except ValueError:
        raise BadInput("--size", f"{text!r}: expected three whole numbers, e.g. c16=8x16x128") from None
    if p < 1 or c < 1 or t < 1:
        raise BadInput("--size", f"{text!r}: every number must be at least 1")
    return CellSpec(name=name, prompts=p, concurrency=c, max_tokens=t)


class Pins(BaseModel):
    """What a wave ran on, exactly: the config, the deployment, the image, the drafter, the prompts, the boot."""

    config_sha256: str
    fingerprint: str
    image_id: str
    drafter_digest: str
    prompts_sha256: str
    boot_id: str
    metrics_boot_id: float | None = None  # vLLM's process_start_time_seconds as the cell saw it


class Samples(BaseModel):
    """Each request's figures, in request order: output tokens, output chunks (≈ engine steps), time to the
    first token and the whole latency (s). The intervals resample these."""

    tokens: list[int]
    chunks: list[int]
    ttft_s: list[float | None]
    latency_s: list[float | None]

    @classmethod
    def of(cls, outcomes: list[RequestOutcome]) -> Samples:
        ok = [o for o in outcomes if not o.error]
        return cls(tokens=[o.completion_tokens for o in ok], chunks=[o.chunks for o in ok],
                   ttft_s=[_r(o.ttft_s) for o in ok], latency_s=[_r(o.latency_s) for o in ok])


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


class Wave(BaseModel):
    """One cell run once on one boot, as banked: the bench record, the per-request samples, the pins, and
    why it is excluded (None: it counts)."""

    slot: int
    round: int
    drafter: str
    cell: str
    boot_row: int
    result: BenchResult
    samples: Samples
    pins: Pins
    excluded: str | None = None
    id: int | None = None  # the journal row, once banked
    replica: int | None = None  # the replica it ran on (replicas: N); None: the config's one stack

    @property
    def counts(self) -> bool:
        return self.excluded is None


def wave_exclusion(result: BenchResult, first_metrics_boot: float | None, boot_id: str,
                   boot_id_now: str) -> str | None:
    """Why a wave must not count, or None: a bench guard refused it (restart, contamination, short forced
    length, failed requests, no drafts), vLLM's ``process_start_time_seconds`` moved since the boot's first
    cell, or a rank of the boot restarted (its boot id, from the containers or processes, changed)."""
    if result.refused:
        return "bench guard: " + "; ".join(result.refused)
    if first_metrics_boot is not None and result.boot_id != first_metrics_boot:
        return "the server restarted since this boot's first cell (process_start_time_seconds changed)"
    if boot_id_now != boot_id:
        return "a rank of this boot restarted during the cell"
    return None


class Boot(BaseModel):
    """One boot of one drafter, as banked: its gates and pins, or why it did not count."""

    id: int | None = None
    slot: int
    round: int
    drafter: str
    ok: bool
    excluded: str | None = None
    fingerprint: str | None = None
    image_id: str | None = None
    drafter_digest: str | None = None
    boot_id: str | None = None
    seconds: float | None = None
    replica: int | None = None  # the replica it booted on (replicas: N); None: the config's one stack
