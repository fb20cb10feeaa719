"""`sparkserve tune K` (and `max-num-seqs`, `capture-sizes`): an A/B campaign over the values of one setting
that the drafter and the card allow, each a variant of the config, read as a recommendation per cell.

    req = TuneRequest(knob="K", cells=[…], rounds=4, max_boots=12)
    outcome = run_tune(cfg, nodes, req, say=print)        # the campaign, stopped early when the leader is clear
    outcome.table.cells[0].advice                          # "K=5 for c1: output tok/s +4.1 % [2.3, 5.8] over K=7"
    apply_choice(Path("sparkserve.yaml"), outcome)         # the primary cell's choice written, comments kept

Candidates (:func:`candidates`), the current value first (it is the campaign's baseline):

* ``K`` (``speculative.num_speculative_tokens``): 1 … block_size − 1 of the configured drafter (a DFlash2 block
  drafts at most block − 1), the card's values first — 7 (what the drafter card trained and measured), 5
  ("k=5 also boots on this image", 2026-09-26) and 4 (the card's banked ``c16-k4`` cell) — then the rest,
  nearest the current value first;
* ``max-num-seqs`` (``serve.max_num_seqs``): the card's 6, then 4, 8, 16, 2 (at most 512: the checkpoint's
  Mamba state blocks);
* ``capture-sizes`` (``serve.compilation.cudagraph_capture_sizes``): the card's ``[1, 2, 4, 8, 16, 24, 32]``,
  then shorter and longer ladders.

``--values`` replaces the list (each value checked the same way). The budget: ``--max-boots`` keeps the first
candidates that fit (said so); ``--max-boots`` / ``--max-minutes`` also stop the campaign before a boot that
would pass them. From the second round on, after each pair of rounds (ABBA), the campaign looks: when on every
cell the leader beats every other candidate beyond noise at the look's level (95 % split over the looks,
Bonferroni), it stops there and says so (:func:`sparkserve.measure.tune_stats.leader_clear`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkserve.campaign.drive import CampaignOutcome, run_campaign
from sparkserve.campaign.slots import StopCheck
from sparkserve.campaign.spec import CampaignRequest, journal_open, load_campaign
from sparkserve.config import Config
from sparkserve.config.profiles import uses_drafter
from sparkserve.deploy.inputs import model_inputs
from sparkserve.deploy.teardown import Reporter, quiet
from sparkserve.errors import BadInput
from sparkserve.measure.ab_records import CampaignSpec, CellSpec, Slot
from sparkserve.measure.tune_stats import TuneTable, leader_clear, tune_table, value_label
from sparkserve.models.drafter import inspect_drafter
from sparkserve.nodes.base import Node

K_FIELD = "speculative.num_speculative_tokens"
SEQS_FIELD = "serve.max_num_seqs"
SIZES_FIELD = "serve.compilation.cudagraph_capture_sizes"
KNOBS = {"K": K_FIELD, "max-num-seqs": SEQS_FIELD, "capture-sizes": SIZES_FIELD}
#: the card's K values, in the order it stands behind them: 7 trained and measured (drafter card), 5 boots
#: (README @1c142c9, "k=5 also boots on this image (2026-09-26, not benchmarked)"), 4 the banked c16-k4 cell
CARD_K = (7, 5, 4)
CARD_SEQS = (6, 4, 8, 16, 2)
MAX_SEQS = 512  # the W4A16 checkpoint's 512 Mamba/KDA state blocks (its HF card: --max-num-seqs ≤ 512)
CARD_SIZES = ([1, 2, 4, 8, 16, 24, 32], [1, 2, 4, 8], [1, 2, 4, 8, 16], [1, 2, 4, 8, 16, 24, 32, 48, 64])
LEVEL = 0.95


@dataclass
class TuneRequest:
    """What ``tune`` was asked: the knob (``K``, ``max-num-seqs``, ``capture-sizes``), optional values, the
    cells and rounds, the budget, and the campaign's usual choices (prompts, protocol, seed, design)."""

    knob: str
    cells: list[CellSpec]
    values: list[Any] | None = None
    rounds: int = 4
    prompts: Path | None = None
    seed: int | None = None
    primary: str | None = None
    bootstrap: int = 2000
    protocol: str = "card"
    chat_template: Path | None = None
    design: str = "sequential"
    max_boots: int | None = None
    max_minutes: float | None = None
    min_effect: float = 0.01


@dataclass
class TuneOutcome:
    """The campaign and its reading: the table per cell, the primary cell, why it stopped early (if it did)."""

    campaign: int
    knob: str  # the dotted field
    table: TuneTable
    primary: str
    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # what the candidate list left out, and why
    stopped: str | None = None
    outcome: CampaignOutcome | None = None

    @property
    def choice(self) -> Any:
        """The primary cell's recommended value when it differs from the current one, else None."""
        cell = next((c for c in self.table.cells if c.cell == self.primary), None)
        if cell is None or not cell.change or cell.recommend is None:
            return None
        return self.values[cell.recommend]


def _current(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return list(node) if isinstance(node, list) else node


def _block_size(cfg: Config, nodes: dict[str, Node]) -> int:
    """The configured drafter's block size (its config.json, here or on the head)."""
    with model_inputs(cfg, nodes[cfg.head.name]) as where:
        if where.missing:
            raise where.missing[0]
        if where.drafter is None:
            raise BadInput("drafter.path", "cannot read the drafter's config.json: tune K needs its block size")
        block = inspect_drafter(where.drafter).block_size
    if not block or block < 2:
        raise BadInput("drafter.path", "the drafter's config.json names no block_size: tune K needs it (K ≤ "
                       "block_size − 1); give the values with --values")
    return block


def candidates(cfg: Config, nodes: dict[str, Node], knob: str, values: list[Any] | None) -> tuple[list[Any], str]:
    """The values to compare, the current one first, and a phrase saying where the list comes from."""
    dotted = KNOBS[knob]
    now = _current(cfg, dotted)
    if knob == "K":
        if not uses_drafter(cfg):
            raise BadInput("speculative.method", "tune K compares a DFlash drafter's K: the mtp head's K is the "
                           "profile's (3)")
        block = _block_size(cfg, nodes)
        allowed = list(range(1, block))
        if values is not None:
            bad = [v for v in values if not isinstance(v, int) or v not in allowed]
            if bad:
                raise BadInput("--values", f"K={bad[0]} is outside 1 … {block - 1} (block_size {block} − 1 of the "
                               "configured drafter)")
            out = list(values)
        else:
            rest = sorted((k for k in allowed if k not in CARD_K), key=lambda k: (abs(k - now), -k))
            out = [k for k in CARD_K if k in allowed] + rest
        where = f"K 1 … {block - 1} (block_size {block} − 1), the card's 7, 5, 4 first"
    elif knob == "max-num-seqs":
        if values is not None:
            bad = [v for v in values if not isinstance(v, int) or not 1 <= v <= MAX_SEQS]
            if bad:
                raise BadInput("--values", f"max_num_seqs={bad[0]} is outside 1 … {MAX_SEQS}")
        out = list(values) if values is not None else list(CARD_SEQS)
        where = "the card's 6 first" if values is None else "--values"
    else:
        if values is not None:
            bad = [v for v in values if not isinstance(v, list) or not v or
                   any(not isinstance(x, int) or x < 1 for x in v)]
            if bad:
                raise BadInput("--values", f"{bad[0]!r}: a capture-sizes value is a list of batch sizes, e.g. 1,2,4,8")
        out = [sorted(set(v)) for v in values] if values is not None else [list(v) for v in CARD_SIZES]
        where = "the card's [1, 2, 4, 8, 16, 24, 32] first" if values is None else "--values"
    if values is not None and knob == "K":
        where = "--values"
    ordered = [now] + [v for v in out if v != now]
    seen: list[Any] = []
    for v in ordered:
        if v not in seen:
            seen.append(v)
    if len(seen) < 2:
        raise BadInput("--values", f"give at least one value besides the current {value_label(dotted, now)}")
    return seen, where


def arm_name(knob: str, value: Any, taken: set[str]) -> str:
    """``K5``, ``seqs8``, ``sizes7-32`` (seven sizes up to 32): a candidate's arm name in the journal."""
    if knob == "K":
        base = f"K{value}"
    elif knob == "max-num-seqs":
        base = f"seqs{value}"
    else:
        base = f"sizes{len(value)}-{max(value)}"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def fit_budget(values: list[Any], rounds: int, max_boots: int | None) -> tuple[list[Any], int, list[str]]:
    """The candidates and rounds a ``--max-boots`` budget allows up front, and what it left out, in words."""
    notes: list[str] = []
    if max_boots is None or len(values) * rounds <= max_boots:
        return values, rounds, notes
    if max_boots < 4:
        raise BadInput("--max-boots", f"{max_boots} boots cannot compare two values over two rounds (at least 4)")
    if max_boots // len(values) >= 2:  # every candidate, fewer rounds
        rounds = max_boots // len(values)
        notes.append(f"--max-boots {max_boots}: {rounds} rounds of all {len(values)} candidates")
        return values, rounds, notes
    rounds, keep = 2, max_boots // 2  # two rounds (an interval across boots), the first candidates
    notes.append(f"--max-boots {max_boots} at 2 rounds: {keep} of {len(values)} candidates, the rest left out: "
                 f"{', '.join(map(str, values[keep:]))}")
    values = values[:keep]
    return values, rounds, notes


def looks_of(rounds: int) -> list[int]:
    """The rounds after which the campaign looks (after each ABBA pair, before the last round)."""
    return list(range(2, rounds, 2))


def _stopper(req: TuneRequest, t0: float, labels: dict[str, str]):  # noqa: ANN202
    def make(cid: int, spec: CampaignSpec) -> StopCheck:
        looks = looks_of(spec.rounds)
        level = 1 - (1 - LEVEL) / (len(looks) + 1)  # Bonferroni over the interim looks and the final reading
        looked: set[int] = set()

        def check(slot: Slot, i: int) -> str | None:
            with journal_open() as j:
                _, _, boots, waves = load_campaign(j, cid)
            if req.max_boots is not None and len(boots) >= req.max_boots:
                return f"budget: --max-boots {req.max_boots} spent"
            if req.max_minutes is not None and boots:
                spent = time.monotonic() - t0
                per = spent / len(boots)
                if spent + per > req.max_minutes * 60:
                    return (f"budget: --max-minutes {req.max_minutes:g} — {spent / 60:.1f} min spent, another boot "
                            f"would take ~{per / 60:.1f} min")
            if slot.round in looks and slot.round not in looked and i == min(
                    k for k, s in enumerate(spec.order) if s.round == slot.round):
                looked.add(slot.round)
                clear = leader_clear(spec, waves, level=level, min_effect=req.min_effect)
                if clear:
                    who = ", ".join(f"{labels[a]} at {c}" for c, a in clear.items())
                    return (f"the leader is clear after round {slot.round} of {spec.rounds}: {who} beats every other "
                            f"candidate beyond noise at the look's {level * 100:.1f} % level (95 % split over "
                            f"{len(looks) + 1} looks)")
            return None

        return check

    return make


def run_tune(cfg: Config, nodes: dict[str, Node], req: TuneRequest, *, say: Reporter = quiet,
             progress: bool = False) -> TuneOutcome:
    """Pick the candidates, run the campaign (stopping early by budget or a clear leader), read the table."""
    t0 = time.monotonic()
    dotted = KNOBS[req.knob]
    values, where = candidates(cfg, nodes, req.knob, req.values)
    values, rounds, notes = fit_budget(values, req.rounds, req.max_boots)
    taken: set[str] = set()
    names = [arm_name(req.knob, v, taken) for v in values]
    by_name = dict(zip(names, values, strict=True))
    labels = {n: value_label(dotted, v) for n, v in by_name.items()}
    say(f"tune {req.knob}: {len(values)} candidates ({where}): " + ", ".join(labels.values())
        + f"; {rounds} round(s), current {labels[names[0]]} is the baseline")
    for n in notes:
        say(f"tune {req.knob}: {n}")
    creq = CampaignRequest(
        drafters=[], variants=[(n, {dotted: v}) for n, v in by_name.items()], cells=req.cells, rounds=rounds,
        prompts=req.prompts, seed=req.seed, primary=req.primary, bootstrap=req.bootstrap, protocol=req.protocol,
        chat_template=req.chat_template, design=req.design, tuning=dotted)
    outcome = run_campaign(cfg, nodes, creq, say=say, progress=progress, stop=_stopper(req, t0, labels))
    with journal_open() as j:
        _, spec, _, waves = load_campaign(j, outcome.campaign)
    table = tune_table(spec, waves, values=dict(by_name), min_effect=req.min_effect)
    return TuneOutcome(campaign=outcome.campaign, knob=dotted, table=table, primary=spec.rule.primary,
                       values=dict(by_name), notes=notes, stopped=outcome.stopped, outcome=outcome)


def apply_choice(config_file: Path, out: TuneOutcome) -> str:
    """``--apply``: the primary cell's recommended value written into ``config_file`` (comments kept) with a
    comment citing the campaign; the line that says what was done."""
    from sparkserve.deploy.config_write import write_config_setting

    choice = out.choice
    label = value_label(out.knob, choice)
    cell = next(c for c in out.table.cells if c.cell == out.primary)
    if choice is None:
        return (f"nothing applied: {cell.advice} (the {out.primary} cell decides --apply); {config_file} is "
                "unchanged")
    write_config_setting(config_file, out.knob, choice,
                         f"sparkserve tune: campaign {out.campaign}, {out.primary}: {cell.advice}")
    return (f"applied {label} to {config_file} ({out.knob}, the {out.primary} cell's choice; comment cites campaign "
            f"{out.campaign}); `sparkserve up` serves it")
