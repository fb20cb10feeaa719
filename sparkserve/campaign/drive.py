"""`ab run`: an A/B campaign of drafters — each booted in turn through the swap path, gated, benched, banked.

    outcome = run_campaign(cfg, nodes, CampaignRequest(drafters=[("A", a), ("B", b)], cells=[…], rounds=2))
    outcome = resume_campaign(cfg, nodes, 7)            # the interrupted campaign 7, finished cells kept

1. every drafter is validated against the config first (nothing starts when one is wrong, exit 2), hashed,
   and the campaign (drafters, cells, rounds, seed, order, prompts digest, rule) is written to the journal;
2. every drafter is synced to every node once, next to the configured one (``swap.swapped_config``: the
   path a swap would use), before the first boot;
3. boot by boot in the interleaved order (``ab_records.interleaved_order``): `up` with that drafter's bind
   mount (no image rebuild) and the gates; a boot whose gates fail, or that does not come up, is banked as
   excluded and the campaign goes on; then the cells (by the card's protocol unless the request says
   ``forced``; the spec's ``sampling`` keeps which, and the chat template's sha256), each banked with
   its pins (config, deployment, image, drafter digest, prompts digest, boot id) and excluded when a
   bench guard refused it or the boot restarted;
4. at the end the drafter that was serving before the campaign is booted again (``swap.serving_config``),
   or the stack is taken down when nothing served.

Ctrl-C (SIGTERM, SIGHUP): the cell in flight is dropped, the campaign is marked interrupted, the serving
drafter is restored as at the end, and the run exits 3; ``resume_campaign`` runs only what is missing.
The campaign never writes the config file.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkserve import interrupts
from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy.drafter import sync_drafter
from sparkserve.deploy.gates_live import boot_id
from sparkserve.deploy.inputs import validate_inputs
from sparkserve.deploy.stack import down, managed_on_all
from sparkserve.deploy.swap import serving_config, swapped_config
from sparkserve.deploy.teardown import Reporter, interrupted, interrupted_what, quiet
from sparkserve.deploy.up import UpResult, up
from sparkserve.errors import BadInput, GateFailed, RemoteFailure, SparkserveError
from sparkserve.journal import Journal
from sparkserve.measure.ab_records import (
    DEFAULT_PRIMARY,
    Arm,
    Boot,
    CampaignSpec,
    CellSpec,
    Pins,
    Rule,
    Samples,
    Slot,
    Wave,
    wave_exclusion,
)
from sparkserve.measure.ab_report import Report, build_report
from sparkserve.measure.chat_template import ChatTemplate, load_chat_template
from sparkserve.measure.prompts import BUILTIN_NAME, PromptSet, builtin_prompts, load_prompts
from sparkserve.measure.records import CARD, FORCED, Sampling, sampling_for
from sparkserve.measure.run import run_cell_outcomes_async, target_template
from sparkserve.models.manifest import manifest
from sparkserve.nodes.base import Node


@dataclass
class CampaignRequest:
    """What ``ab run`` was asked: named drafter directories (the first is the baseline), cells, rounds."""

    drafters: list[tuple[str, Path]]
    cells: list[CellSpec]
    rounds: int = 1
    prompts: Path | None = None
    seed: int | None = None
    primary: str | None = None
    bootstrap: int = 2000
    protocol: str = CARD  # issue 21: the card's holdout protocol by default; "forced" = the streamed forced length
    chat_template: Path | None = None  # card: the target's chat template (default: model.target's own)


@dataclass
class CampaignOutcome:
    """How the run ended, the campaign's journal id and its report; ``restored`` says what serves now."""

    campaign: int
    status: str
    report: Report
    restored: str
    timings: dict[str, float] = field(default_factory=dict)  # seconds per kind of step: bench/bench_ab.py


Progress = Callable[[str], None]


def _journal() -> Journal:
    """The journal is the campaign's state (what ran, what is left): one that cannot be opened stops the
    campaign before anything starts."""
    return Journal.open()


def check_request(cfg: Config, req: CampaignRequest) -> None:
    """The request's own rules (names, rounds, cells, directories exist): BadInput before any node is touched."""
    names = [n for n, _ in req.drafters]
    if len(names) < 2:
        raise BadInput("--drafter", "an A/B campaign needs at least two drafters (--drafter A=PATH --drafter B=PATH)")
    for n in names:
        if not n or not n.replace("-", "").replace("_", "").isalnum():
            raise BadInput("--drafter", f"{n!r}: a drafter name is letters, digits, - or _ (e.g. A=/path)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadInput("--drafter", f"{dup[0]!r} is named twice")
    if req.rounds < 1:
        raise BadInput("--rounds", "must be at least 1")
    if not req.cells:
        raise BadInput("--cells", "name at least one cell")
    cells = [c.name for c in req.cells]
    if req.primary is not None and req.primary not in cells:
        raise BadInput("--primary", f"{req.primary!r} is not one of the campaign's cells ({', '.join(cells)})")
    if len(set(cells)) != len(cells):
        raise BadInput("--cells", "names a cell twice")
    if req.bootstrap < 100:
        raise BadInput("--bootstrap", "at least 100 resamples")
    if req.prompts is not None:
        load_prompts(req.prompts.expanduser())  # BadInput naming the file (and line)
    with _journal():  # the campaign's state lives there: an unusable journal stops it here
        pass
    for n, p in req.drafters:
        if not p.expanduser().is_dir():
            raise BadInput(f"--drafter {n}", f"{p} is not a directory")
    if req.protocol == CARD:
        target_template(cfg, req.chat_template)  # BadInput naming the option or the template file


def _arm_config(cfg: Config, arm: Arm, *, with_source: bool) -> Config:
    """The config that boots ``arm``: the swap path's node path, synced from its source (``with_source``) or
    already on every node."""
    c = swapped_config(cfg, Path(arm.source), arm.digest)
    if not with_source:
        c = c.model_copy(update={"drafter": c.drafter.model_copy(update={"source": None})})
    return c


def _load_prompts(source: str) -> PromptSet:
    return builtin_prompts() if source == BUILTIN_NAME else load_prompts(Path(source))


def plan_campaign(cfg: Config, nodes: dict[str, Node], req: CampaignRequest, say: Reporter = quiet) -> CampaignSpec:
    """Validate every drafter (BadInput, nothing touched, for the first wrong one), then hash each: the spec."""
    check_request(cfg, req)
    prompt_set = load_prompts(req.prompts.expanduser()) if req.prompts else builtin_prompts()
    for name, path in req.drafters:
        d = path.expanduser().resolve()
        try:
            validate_inputs(cfg.model_copy(update={"drafter": cfg.drafter.model_copy(update={"source": d})}), nodes)
        except BadInput as e:
            raise BadInput(f"--drafter {name}", f"{d}: {e.where}: {e.what}", details=e.details) from None
    arms = []
    for name, path in req.drafters:
        d = path.expanduser().resolve()
        digest = manifest(d).digest
        node_path = str(swapped_config(cfg, d, digest).drafter.path)
        arms.append(Arm(name=name, source=str(d), digest=digest, node_path=node_path))
        say(f"ab: drafter {name} = {d} ({digest[:12]}) → {node_path} on every node")
    cells = [c.name for c in req.cells]
    sampling = sampling_for(req.protocol).as_dict()
    if req.protocol == CARD:
        tpl = target_template(cfg, req.chat_template)
        sampling |= {"chat_template": tpl.source, "chat_template_sha256": tpl.sha256}
    primary = req.primary or (DEFAULT_PRIMARY if DEFAULT_PRIMARY in cells else cells[0])
    seed = req.seed if req.seed is not None else random.SystemRandom().randrange(1 << 31)
    return CampaignSpec(
        drafters=arms, cells=req.cells, rounds=req.rounds, seed=seed, prompts_source=prompt_set.source,
        prompts_sha256=prompt_set.sha256, config_sha256=cfg.fingerprint(),
        rule=Rule(baseline=arms[0].name, primary=primary), bootstrap=req.bootstrap, sampling=sampling,
    )


def campaign_sampling(spec: CampaignSpec, campaign_id: int | None = None) -> tuple[Sampling, ChatTemplate | None]:
    """The protocol a campaign runs its cells by (campaigns from before issue 21: forced) and, for the card's,
    the chat template it started with — BadInput when that file is gone or changed."""
    protocol = str(spec.sampling.get("protocol") or FORCED)
    if protocol != CARD:
        return sampling_for(FORCED), None
    src = str(spec.sampling.get("chat_template") or "")
    tpl = load_chat_template(Path(src), where="chat template")
    if tpl.sha256 != spec.sampling.get("chat_template_sha256"):
        what = f"campaign {campaign_id}" if campaign_id is not None else "the campaign"
        raise BadInput(src, f"chat template changed since {what} started (sha256 {tpl.sha256[:12]}, was "
                       f"{str(spec.sampling.get('chat_template_sha256'))[:12]})")
    return sampling_for(CARD), tpl


def load_campaign(j: Journal, campaign_id: int) -> tuple[str, CampaignSpec, list[Boot], list[Wave]]:
    """A campaign's status, spec, boots and waves as banked; BadInput when there is none or a row was edited."""
    got = j.campaign(campaign_id)
    if got is None:
        raise BadInput("campaign", f"no A/B campaign {campaign_id} in the journal {j.path}")
    status, spec_json, ok = got
    if not ok:
        raise BadInput("campaign", f"campaign {campaign_id}'s record was edited after it was written (sha256 mismatch)")
    spec = CampaignSpec.model_validate_json(spec_json)
    boots = []
    for row, text in j.campaign_boots(campaign_id):
        b = Boot.model_validate_json(text)
        b.id = row
        boots.append(b)
    waves = []
    for row, text, sha_ok in j.campaign_waves(campaign_id):
        if not sha_ok:
            raise BadInput("campaign", f"campaign {campaign_id}'s wave #{row} was edited after it was written "
                           "(sha256 mismatch)")
        w = Wave.model_validate_json(text)
        w.id = row
        waves.append(w)
    return status, spec, boots, waves


def campaign_report(campaign_id: int) -> Report:
    """``ab report ID``: the table of record from the journal alone (no node is touched)."""
    with _journal() as j:
        status, spec, boots, waves = load_campaign(j, campaign_id)
    return build_report(campaign_id, status, spec, waves, boots)


def run_campaign(cfg: Config, nodes: dict[str, Node], req: CampaignRequest, *, say: Reporter = quiet,
                 progress: bool = False) -> CampaignOutcome:
    """A new campaign (see the module docstring)."""
    with _journal() as j:
        spec = plan_campaign(cfg, nodes, req, say)
        cid = j.create_campaign(spec.config_sha256, spec.model_dump_json())
    say(f"ab: campaign {cid}: {len(spec.order)} boots, cells {', '.join(c.name for c in spec.cells)}, seed "
        f"{spec.seed}, order {' '.join(s.drafter for s in spec.order)}")
    return _drive(cfg, nodes, cid, spec, say=say, progress=progress)


def check_resume(cfg: Config, campaign_id: int) -> CampaignSpec:
    """Whether campaign ``campaign_id`` can resume with this config (journal, config, prompts and drafter
    digests as it started): its spec, or BadInput — before any node is touched."""
    with _journal() as j:
        status, spec, _, _ = load_campaign(j, campaign_id)
    if status == "done":
        raise BadInput("--resume", f"campaign {campaign_id} is done: `sparkserve ab report {campaign_id}`")
    if cfg.fingerprint() != spec.config_sha256:
        raise BadInput("--resume", f"campaign {campaign_id} ran config {spec.config_sha256[:12]}, this is "
                       f"{cfg.fingerprint()[:12]}: resume it with the same config")
    prompt_set = _load_prompts(spec.prompts_source)
    if prompt_set.sha256 != spec.prompts_sha256:
        raise BadInput(spec.prompts_source, f"changed since campaign {campaign_id} started (sha256 "
                       f"{prompt_set.sha256[:12]}, was {spec.prompts_sha256[:12]})")
    campaign_sampling(spec, campaign_id)
    for arm in spec.drafters:
        src = Path(arm.source)
        if not src.is_dir() or manifest(src).digest != arm.digest:
            raise BadInput(f"drafter {arm.name}", f"{src} is not the directory campaign {campaign_id} started "
                           f"with (digest {arm.digest[:12]})")
    return spec


def resume_campaign(cfg: Config, nodes: dict[str, Node], campaign_id: int, *, say: Reporter = quiet,
                    progress: bool = False) -> CampaignOutcome:
    """Run what campaign ``campaign_id`` has not banked yet (BadInput when it cannot resume: see
    :func:`check_resume`); cells already banked are not run again."""
    spec = check_resume(cfg, campaign_id)
    say(f"ab: resuming campaign {campaign_id}")
    return _drive(cfg, nodes, campaign_id, spec, say=say, progress=progress)


@dataclass
class _Clock:
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


def _done_cells(waves: list[Wave], slot: int) -> set[str]:
    return {w.cell for w in waves if w.slot == slot}


def _slot_finished(spec: CampaignSpec, boots: list[Boot], waves: list[Wave], slot: int) -> bool:
    """A slot is finished once all its cells are banked, or once a boot of it was excluded (the boot is the
    unit: a failed boot is the slot's result, not something to retry)."""
    if any(b.slot == slot and b.excluded for b in boots):
        return True
    return _done_cells(waves, slot) >= {c.name for c in spec.cells}


def _drive(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, *, say: Reporter,
           progress: bool) -> CampaignOutcome:
    clock = _Clock()
    head = nodes[cfg.head.name]
    ran_before = any(c.running for c in managed_on_all({cfg.head.name: head}, cfg).get(cfg.head.name, []))
    before = serving_config(cfg, nodes) if ran_before else None
    try:
        t = time.monotonic()
        for arm in spec.drafters:  # every drafter to every node, once
            synced = sync_drafter(_arm_config(cfg, arm, with_source=True), nodes, say)
            if synced.digest != arm.digest:
                raise BadInput(f"drafter {arm.name}", f"{arm.source} changed while the campaign started")
        clock.sync = time.monotonic() - t
        _slots(cfg, nodes, cid, spec, clock, say=say, progress=progress)
    except BaseException as e:
        if not interrupted(e):
            _set_status(cid, "failed")
            restored = _restore(cfg, nodes, before, say)
            say(f"ab: campaign {cid} failed; {restored}")
            raise
        what = interrupted_what()
        _set_status(cid, "interrupted")
        say(f"ab: campaign {cid} {what}: restoring what served before")
        restored = _restore(cfg, nodes, before, say)
        raise RemoteFailure("ab run", f"{what}: campaign {cid} stopped, finished cells are banked; {restored}; "
                            f"resume with `sparkserve ab run --resume {cid}`", step="interrupted") from None
    _set_status(cid, "done")
    t = time.monotonic()
    restored = _restore(cfg, nodes, before, say)
    clock.restore = time.monotonic() - t
    if interrupts.stopping():  # Ctrl-C during the restore: the campaign is banked, the stack is not back
        raise RemoteFailure("ab run", f"{interrupted_what()}: campaign {cid} is done and banked (`sparkserve ab "
                            f"report {cid}`); {restored}", step="interrupted")
    t = time.monotonic()
    report = campaign_report(cid)
    timings = {"wall": time.monotonic() - clock.t0, "sync": clock.sync, "boots": sum(clock.boots),
               "cells": sum(sum(v) for v in clock.cells.values()), "requests": clock.requests,
               "restore": clock.restore, "report": time.monotonic() - t}
    return CampaignOutcome(cid, "done", report, restored, timings)


def _set_status(cid: int, status: str) -> None:
    with _journal() as j:
        j.set_campaign_status(cid, status)


def _restore(cfg: Config, nodes: dict[str, Node], before: Config | None, say: Reporter) -> str:
    """Bring back what served before the campaign; the one line that says what serves now."""
    try:
        if before is None:
            down(cfg, nodes, say=say)
            return "nothing served before the campaign: nothing runs now"
        res = up(before, nodes, validate=False, say=say)
        return f"restored drafter {before.drafter.path} ({res.drafter_digest[:12]}) at {res.api_url}"
    except SparkserveError as e:
        if interrupted(e):
            return f"restoring {before.drafter.path if before else 'the empty stack'} was interrupted: nothing runs"
        return f"restoring {before.drafter.path if before else 'the empty stack'} FAILED ({e.line()}): check the stack"


def _slots(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, clock: _Clock, *, say: Reporter,
           progress: bool) -> None:
    prompt_set = _load_prompts(spec.prompts_source)
    sampling, template = campaign_sampling(spec, cid)
    order = spec.order
    for i, slot in enumerate(order):
        with _journal() as j:
            _, _, boots, waves = load_campaign(j, cid)
        if _slot_finished(spec, boots, waves, i):
            continue
        left = [k for k in range(i, len(order)) if not _slot_finished(spec, boots, waves, k)]
        cells_left = {c.name: sum(1 for k in left if c.name not in _done_cells(waves, k)) for c in spec.cells}
        where = f"round {slot.round + 1}/{spec.rounds} · boot {i + 1}/{len(order)} · drafter {slot.drafter}"
        say(f"ab: {where} · booting · {clock.eta(len(left), cells_left)}")
        _one_slot(cfg, nodes, cid, spec, i, slot, _done_cells(waves, i), prompt_set, clock, where=where, say=say,
                  progress=progress, boots_left=len(left) - 1, cells_left=cells_left, sampling=sampling,
                  template=template)


def _boot(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, i: int, slot: Slot, clock: _Clock,
          say: Reporter) -> tuple[Boot, UpResult | None]:
    arm = spec.arm(slot.drafter)
    t = time.monotonic()
    res: UpResult | None = None
    excluded = None
    try:
        res = up(_arm_config(cfg, arm, with_source=False), nodes, validate=False, say=say)
    except GateFailed as e:
        excluded = f"gates failed: {e.what}"
    except SparkserveError as e:
        if interrupted(e):
            raise
        excluded = f"boot failed: {e.line().removeprefix('error: ')}"
    clock.boots.append(time.monotonic() - t)
    if res is not None and res.drafter_digest != arm.digest:
        excluded = f"the nodes hold drafter {res.drafter_digest[:12]}, not {arm.digest[:12]}"
    boot = Boot(slot=i, round=slot.round, drafter=slot.drafter, ok=excluded is None, excluded=excluded,
                seconds=round(clock.boots[-1], 3))
    if res is not None:
        boot.fingerprint, boot.image_id, boot.drafter_digest = res.fingerprint, res.image_id, res.drafter_digest
        boot.boot_id = boot_id(nodes, res.containers, cfg)
    with _journal() as j:
        boot.id = j.record_campaign_boot(cid, i, boot.ok, boot.model_dump_json())
    return boot, (res if excluded is None else None)


def _one_slot(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, i: int, slot: Slot,
              done: set[str], prompt_set: PromptSet, clock: _Clock, *, where: str, say: Reporter,
              progress: bool, boots_left: int, cells_left: dict[str, int], sampling: Sampling = Sampling(),
              template: ChatTemplate | None = None) -> None:
    """Boot slot ``i`` and run its cells not yet banked (``done``); ``boots_left`` / ``cells_left``: what
    remains of the campaign after this boot (cells: including this slot's), for the ETA."""
    boot, res = _boot(cfg, nodes, cid, spec, i, slot, clock, say)
    if res is None:
        say(f"ab: {where}: excluded — {boot.excluded}")
        return
    assert boot.id is not None and boot.boot_id is not None
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
            )
        except SparkserveError as e:
            if interrupted(e):
                raise
            say(f"ab: {where} · cell {cs.name}: {e.line()}")
            continue  # nothing measured: the slot stays unfinished, a resume runs it again
        clock.cells.setdefault(cs.name, []).append(time.monotonic() - t)
        clock.requests += result.duration_s
        excluded = wave_exclusion(result, first_metrics_boot, boot.boot_id, boot_id(nodes, res.containers, cfg))
        if first_metrics_boot is None:
            first_metrics_boot = result.boot_id
        pins = Pins(config_sha256=spec.config_sha256, fingerprint=res.fingerprint, image_id=res.image_id,
                    drafter_digest=res.drafter_digest, prompts_sha256=prompt_set.sha256, boot_id=boot.boot_id,
                    metrics_boot_id=result.boot_id)
        wave = Wave(slot=i, round=slot.round, drafter=slot.drafter, cell=cs.name, boot_row=boot.id, result=result,
                    samples=Samples.of(outcomes), pins=pins, excluded=excluded)
        with _journal() as j:
            wid = j.record_campaign_wave(cid, boot.id, i, cs.name, wave.counts, wave.model_dump_json())
        al = "n/a" if result.acceptance_length is None else f"{result.acceptance_length:.2f}"
        say(f"ab: {where} · cell {cs.name}: {result.output_tok_s:,.1f} tok/s, accept {al} (wave #{wid})"
            + (f" — excluded: {excluded}" if excluded else ""))
