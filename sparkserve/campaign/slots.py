"""A campaign's boots and cells: one slot booted (`up` with the drafter's bind mount, gates), its cells run and
banked wave by wave with their pins, and the sequential design's loop over the slots.

    Clock().eta(boots_left, cells_left)                 # the ETA the progress lines show
    boot, res = boot_slot(cfg, nodes, cid, spec, i, slot, clock, say)   # banked; res None: excluded
    run_sequential(cfg, nodes, cid, spec, clock, say=say, progress=True)

``cfg`` and ``nodes`` are one stack's: the config's own, or one replica's (its config and its nodes). The
crossed design (:mod:`sparkserve.campaign.crossed`) boots several slots at once with the same pieces.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkserve import interrupts
from sparkserve.campaign.spec import arm_config, campaign_sampling, journal_open, load_campaign, prompts_of
from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy.gates_live import boot_id
from sparkserve.deploy.teardown import Reporter, interrupted
from sparkserve.deploy.up import BootWatcher, UpResult, up
from sparkserve.errors import GateFailed, SparkserveError
from sparkserve.measure.ab_records import Boot, CampaignSpec, CellSpec, Pins, Samples, Slot, Wave, wave_exclusion
from sparkserve.measure.chat_template import ChatTemplate
from sparkserve.measure.prompts import PromptSet
from sparkserve.measure.records import BenchResult, RequestOutcome, Sampling
from sparkserve.measure.run import default_warmup, run_cell_outcomes_async
from sparkserve.nodes.base import Node


@dataclass
class Clock:
    """Seconds spent per kind of step, for the ETA and bench/bench_ab.py."""

    t0: float = field(default_factory=time.monotonic)
    boots: list[float] = field(default_factory=list)
    cells: dict[str, list[float]] = field(default_factory=dict)
    restore: float = 0.0
    sync: float = 0.0
    requests: float = 0.0  # the cells' own run time: their requests (BenchResult.duration_s)

    def eta(self, boots_left: int, cells_left: dict[str, int]) -> str:
        if not self.boots:
            return "ETA —"
        s = boots_left * sum(self.boots) / len(self.boots)
        for name, n in cells_left.items():
            seen = self.cells.get(name)
            if not seen:
                return "ETA —"
            s += n * sum(seen) / len(seen)
        m, sec = divmod(int(s + 0.5), 60)
        return f"ETA {m}m{sec:02d}s"


def done_cells(waves: list[Wave], slot: int) -> set[str]:
    return {w.cell for w in waves if w.slot == slot}


def slot_finished(spec: CampaignSpec, boots: list[Boot], waves: list[Wave], slot: int) -> bool:
    """A slot is finished once all its cells are banked, or once a boot of it was excluded (the boot is the
    unit: a failed boot is the slot's result, not something to retry)."""
    if any(b.slot == slot and b.excluded for b in boots):
        return True
    return done_cells(waves, slot) >= {c.name for c in spec.cells}


def up_slot(cfg: Config, nodes: dict[str, Node], spec: CampaignSpec, slot: Slot, *, say: Reporter,
            on_update: BootWatcher | None = None) -> tuple[UpResult | None, str | None, float]:
    """`up` of the slot's drafter (no journal row: safe in a thread of its own): the result, why it is excluded
    (None: it serves that drafter), and the seconds it took."""
    arm = spec.arm(slot.drafter)
    t = time.monotonic()
    res: UpResult | None = None
    excluded = None
    try:
        # fresh: every slot is an engine boot of its own, also the second of two slots of one arm in a row (ABBA)
        res = up(arm_config(cfg, arm, with_source=False), nodes, validate=False, fresh=True, say=say,
                 on_update=on_update)
    except GateFailed as e:
        excluded = f"gates failed: {e.what}"
    except SparkserveError as e:
        if interrupted(e):
            raise
        excluded = f"boot failed: {e.line().removeprefix('error: ')}"
    if res is not None and arm.digest and res.drafter_digest != arm.digest:
        excluded = f"the nodes hold drafter {res.drafter_digest[:12]}, not {arm.digest[:12]}"
    return res, excluded, time.monotonic() - t


def bank_boot(cfg: Config, nodes: dict[str, Node], cid: int, i: int, slot: Slot, res: UpResult | None,
              excluded: str | None, seconds: float, clock: Clock) -> tuple[Boot, UpResult | None]:
    """The boot's journal row (with its pins when it came up); ``res`` back only when the boot counts."""
    clock.boots.append(seconds)
    boot = Boot(slot=i, round=slot.round, drafter=slot.drafter, ok=excluded is None, excluded=excluded,
                seconds=round(seconds, 3), replica=slot.replica)
    if res is not None:
        boot.fingerprint, boot.image_id, boot.drafter_digest = res.fingerprint, res.image_id, res.drafter_digest
        boot.boot_id = boot_id(nodes, res.containers, cfg)
    with journal_open() as j:
        boot.id = j.record_campaign_boot(cid, i, boot.ok, boot.model_dump_json())
    return boot, (res if excluded is None else None)


def boot_slot(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, i: int, slot: Slot, clock: Clock,
              say: Reporter) -> tuple[Boot, UpResult | None]:
    res, excluded, seconds = up_slot(cfg, nodes, spec, slot, say=say)
    return bank_boot(cfg, nodes, cid, i, slot, res, excluded, seconds, clock)


def bank_wave(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, i: int, slot: Slot, boot: Boot,
              res: UpResult, cs: CellSpec, result: BenchResult, outcomes: list[RequestOutcome],
              prompt_set: PromptSet, first_metrics_boot: float | None) -> tuple[Wave, int]:
    """One cell's wave banked with its pins and its exclusion (a bench guard, a restart since the boot)."""
    assert boot.id is not None and boot.boot_id is not None
    excluded = wave_exclusion(result, first_metrics_boot, boot.boot_id, boot_id(nodes, res.containers, cfg))
    pins = Pins(config_sha256=spec.config_sha256, fingerprint=res.fingerprint, image_id=res.image_id,
                drafter_digest=res.drafter_digest, prompts_sha256=prompt_set.sha256, boot_id=boot.boot_id,
                metrics_boot_id=result.boot_id)
    wave = Wave(slot=i, round=slot.round, drafter=slot.drafter, cell=cs.name, boot_row=boot.id, result=result,
                samples=Samples.of(outcomes), pins=pins, excluded=excluded, replica=slot.replica)
    with journal_open() as j:
        wid = j.record_campaign_wave(cid, boot.id, i, cs.name, wave.counts, wave.model_dump_json())
    return wave, wid


def wave_line(cs: CellSpec, result: BenchResult, wave: Wave, wid: int) -> str:
    al = "n/a" if result.acceptance_length is None else f"{result.acceptance_length:.2f}"
    return (f"cell {cs.name}: {result.output_tok_s:,.1f} tok/s, accept {al} (wave #{wid})"
            + (f" — excluded: {wave.excluded}" if wave.excluded else ""))


#: ``sparkserve tune``'s say before each boot (the slot about to boot, its index): a reason to stop the
#: campaign there (a budget spent, the leader clear), or None to go on.
StopCheck = Callable[[Slot, int], "str | None"]


def arm_word(spec: CampaignSpec, name: str) -> str:
    """"drafter B" or "variant k5", as the progress lines name an arm."""
    return f"{'variant' if spec.arm(name).is_variant else 'drafter'} {name}"


def run_sequential(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, clock: Clock, *,
                   say: Reporter, progress: bool, stop: StopCheck | None = None) -> str | None:
    """The sequential design: the slots in the interleaved order, one boot at a time on this one stack. With
    ``stop``, asked before each boot: the reason it stopped the campaign early (None: every slot ran)."""
    prompt_set = prompts_of(spec.prompts_source)
    sampling, template = campaign_sampling(spec, cid)
    order = spec.order
    for i, slot in enumerate(order):
        with journal_open() as j:
            _, _, boots, waves = load_campaign(j, cid)
        if slot_finished(spec, boots, waves, i):
            continue
        why = stop(slot, i) if stop is not None else None
        if why is not None:
            return why
        left = [k for k in range(i, len(order)) if not slot_finished(spec, boots, waves, k)]
        cells_left = {c.name: sum(1 for k in left if c.name not in done_cells(waves, k)) for c in spec.cells}
        where = (f"round {slot.round + 1}/{spec.rounds} · boot {i + 1}/{len(order)} · "
                 f"{arm_word(spec, slot.drafter)}")
        say(f"ab: {where} · booting · {clock.eta(len(left), cells_left)}")
        _one_slot(cfg, nodes, cid, spec, i, slot, done_cells(waves, i), prompt_set, clock, where=where, say=say,
                  progress=progress, boots_left=len(left) - 1, cells_left=cells_left, sampling=sampling,
                  template=template)
    return None


def _one_slot(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, i: int, slot: Slot,
              done: set[str], prompt_set: PromptSet, clock: Clock, *, where: str, say: Reporter,
              progress: bool, boots_left: int, cells_left: dict[str, int], sampling: Sampling = Sampling(),
              template: ChatTemplate | None = None) -> None:
    """Boot slot ``i`` and run its cells not yet banked (``done``); ``boots_left`` / ``cells_left``: what
    remains of the campaign after this boot (cells: including this slot's), for the ETA."""
    boot, res = boot_slot(cfg, nodes, cid, spec, i, slot, clock, say)
    if res is None:
        say(f"ab: {where}: excluded — {boot.excluded}")
        return
    first_metrics_boot: float | None = None
    for cs in spec.cells:
        if cs.name in done:
            continue
        say(f"ab: {where} · cell {cs.name} {cs.shape()} · {clock.eta(boots_left, cells_left)}")
        cells_left[cs.name] -= 1
        t = time.monotonic()
        try:
            result, outcomes = interrupts.run_async(
                run_cell_outcomes_async,
                res.api_url, res.served_name, cs.cell(), prompt_set, sampling=sampling, node=cfg.head.name,
                api_key=resolve_api_key(cfg), progress=progress, template=template,
                warmup=default_warmup(cs.cell()),  # issue 41: unmeasured requests first, so no cell pays it
            )
        except SparkserveError as e:
            if interrupted(e):
                raise
            say(f"ab: {where} · cell {cs.name}: {e.line()}")
            continue  # nothing measured: the slot stays unfinished, a resume runs it again
        clock.cells.setdefault(cs.name, []).append(time.monotonic() - t)
        clock.requests += result.duration_s
        wave, wid = bank_wave(cfg, nodes, cid, spec, i, slot, boot, res, cs, result, outcomes, prompt_set,
                              first_metrics_boot)
        if first_metrics_boot is None:
            first_metrics_boot = result.boot_id
        say(f"ab: {where} · " + wave_line(cs, result, wave, wid))
