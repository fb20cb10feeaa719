"""An A/B campaign's request and record: what `ab run` was asked, the rules it must meet before any node is
touched, the spec it fixes (drafters hashed, cells, rounds, design, seed, protocol), and the journal side —
a campaign read back, reported, or checked before `--resume`.

    req = CampaignRequest(drafters=[("A", a), ("B", b)], cells=[…], rounds=2, design="crossed")
    check_request(cfg, req)                 # BadInput before anything starts
    spec = plan_campaign(cfg, nodes, req)   # every drafter validated and hashed
    report = campaign_report(7)             # `ab report 7`, from the journal alone

The driving (boots, cells, restore) is :mod:`sparkserve.campaign.drive`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkserve.config import Config
from sparkserve.config.profiles import uses_drafter
from sparkserve.config.variants import DRAFTER_KEY, settings_text, variant_config
from sparkserve.deploy.chat_template_remote import head_template_dir, needs_remote_template
from sparkserve.deploy.inputs import check_inputs, validate_inputs
from sparkserve.deploy.swap import swapped_config
from sparkserve.deploy.teardown import Reporter, quiet
from sparkserve.errors import BadInput
from sparkserve.journal import Journal
from sparkserve.measure.ab_records import (
    CROSSED,
    DEFAULT_PRIMARY,
    DESIGNS,
    SEQUENTIAL,
    Arm,
    Boot,
    CampaignSpec,
    CellSpec,
    Rule,
    Wave,
)
from sparkserve.measure.ab_report import Report, build_report
from sparkserve.measure.chat_template import ChatTemplate, load_chat_template
from sparkserve.measure.prompts import BUILTIN_NAME, PromptSet, builtin_prompts, load_prompts
from sparkserve.measure.records import CARD, FORCED, Sampling, sampling_for
from sparkserve.measure.run import target_template
from sparkserve.models.manifest import manifest
from sparkserve.nodes.base import Node
from sparkserve.plan.build import build_plan
from sparkserve.plan.replicas import replicas_of


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
    design: str = SEQUENTIAL  # or CROSSED: each drafter on a replica of its own at once, rotated each round
    variants: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # issue 42: NAME, {KEY: VALUE}
    tuning: str | None = None  # `sparkserve tune`: the one field the variants differ in

    @property
    def arm_names(self) -> list[str]:
        """Every arm's name, the drafters first, then the variants; the first is the baseline."""
        return [n for n, _ in self.drafters] + [n for n, _ in self.variants]


def journal_open() -> Journal:
    """The journal is the campaign's state (what ran, what is left): one that cannot be opened stops the
    campaign before anything starts."""
    return Journal.open()


def check_request(cfg: Config, req: CampaignRequest) -> None:
    """The request's own rules (names, rounds, cells, directories exist): BadInput before any node is touched."""
    names = req.arm_names
    opt = "--variant" if req.variants and not req.drafters else "--drafter"
    if len(names) < 2:
        what = "variants" if opt == "--variant" else "drafters"
        raise BadInput(opt, f"an A/B campaign needs at least two {what} (--drafter A=PATH --drafter B=PATH, or "
                       "--variant k5=speculative.num_speculative_tokens=5 --variant k7=…)")
    for n in names:
        if not n or not n.replace("-", "").replace("_", "").isalnum():
            raise BadInput(opt, f"{n!r}: an arm's name is letters, digits, - or _ (e.g. A=/path)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadInput(opt, f"{dup[0]!r} is named twice")
    if req.drafters and cfg.speculative.method == "mtp":
        raise BadInput("speculative.method", "mtp serves the target's built-in head: an A/B of drafters needs a "
                       "DFlash profile (`sparkserve profiles`), or compare settings with --variant")
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
    check_design(cfg, req.design, len(names), req.rounds)
    if req.prompts is not None:
        load_prompts(req.prompts.expanduser())  # BadInput naming the file (and line)
    journal_open().close()  # the campaign's state lives there: an unusable journal stops it here
    for n, p in req.drafters:
        if not p.expanduser().is_dir():
            raise BadInput(f"--drafter {n}", f"{p} is not a directory")
    for n, settings in req.variants:
        variant_config(cfg, settings, where=f"--variant {n}")  # every field exists, every value fits
        d = settings.get(DRAFTER_KEY)
        if d is not None and not Path(str(d)).expanduser().is_dir():
            raise BadInput(f"--variant {n}", f"drafter: {d} is not a directory")
    if req.protocol == CARD and (req.chat_template is not None or not needs_remote_template(cfg)):
        target_template(cfg, req.chat_template)  # BadInput naming the option or the template file


def check_design(cfg: Config, design: str, drafters: int, rounds: int) -> None:
    """The crossed design needs a replica per drafter and whole rotations (each drafter on each replica)."""
    if design not in DESIGNS:
        raise BadInput("--design", f"{design!r} is not one of {', '.join(DESIGNS)}")
    if design != CROSSED:
        return
    if cfg.replicas < drafters:
        raise BadInput("--design", f"crossed runs every drafter at once, each on a replica of its own: {drafters} "
                       f"drafters need replicas: {drafters} or more (the config has {cfg.replicas})")
    if rounds % drafters:
        raise BadInput("--rounds", f"the crossed design rotates {drafters} drafters over {drafters} replicas: give "
                       f"a multiple of {drafters} rounds, so each drafter runs on each replica (got {rounds})")


def arm_config(cfg: Config, arm: Arm, *, with_source: bool) -> Config:
    """The config that boots ``arm``: the swap path's node path, synced from its source (``with_source``) or
    already on every node. A variant: the config its settings make, its drafter the config's own unless it
    names one (then the swap path's, as a drafter arm)."""
    base = variant_config(cfg, arm.settings, where=f"variant {arm.name}") if arm.is_variant else cfg
    if not arm.source:  # the config's own drafter (or none: mtp), as the config syncs it
        return base
    c = swapped_config(base, Path(arm.source), arm.digest)
    if not with_source:
        c = c.model_copy(update={"drafter": c.drafter.model_copy(update={"source": None})})
    return c


def engine_view(cfg: Config) -> str:
    """Everything the engine is started with (every rank's image, argv, env, mounts, limits), as one string:
    two configs with the same view boot the same engine, whatever else differs (gates, bench, journal)."""
    views = [[s.model_dump(mode="json") for s in build_plan(r.cfg, fingerprint="engine-view").specs]
             for r in replicas_of(cfg)]  # replicas: N — every replica's stack
    return json.dumps(views, sort_keys=True)


def _variant_arm(cfg: Config, nodes: dict[str, Node], name: str, settings: dict[str, Any], say: Reporter) -> Arm:
    """A variant validated like a boot would be (every rule, the K rule against its drafter) and pinned."""
    where = f"--variant {name}"
    vcfg = variant_config(cfg, settings, where=where)
    source = digest = ""
    d = settings.get(DRAFTER_KEY)
    if d is not None:
        src = Path(str(d)).expanduser().resolve()
        digest = manifest(src).digest
        source = str(src)
        vcfg = swapped_config(vcfg, src, digest)
    check = vcfg if not source else vcfg.model_copy(
        update={"drafter": vcfg.drafter.model_copy(update={"source": Path(source)})})
    report, _ = check_inputs(check, nodes[cfg.head.name])
    for w in report.warnings:
        say(f"warning: {where}: {w.where}: {w.what}")
    try:
        report.raise_first()
    except BadInput as e:
        raise BadInput(where, f"{e.where}: {e.what}", details=e.details) from None
    node_path = str(vcfg.drafter.path) if vcfg.drafter is not None and uses_drafter(vcfg) else ""
    return Arm(name=name, source=source, digest=digest, node_path=node_path, settings=settings,
               fingerprint=vcfg.fingerprint())


def check_no_op(cfg: Config, arms: list[Arm]) -> None:
    """A variant must change what the engine sees: one whose settings change the config but not a rank's argv,
    env or mounts is refused as a no-op, and two arms that boot the same engine are one arm named twice."""
    base = engine_view(cfg) + "|"
    seen: dict[str, str] = {}
    for arm in arms:
        view = engine_view(arm_config(cfg, arm, with_source=False)) + "|" + arm.digest
        if arm.is_variant and view == base and arm.fingerprint != cfg.fingerprint():
            keys = ", ".join(arm.settings)
            raise BadInput(f"--variant {arm.name}", f"a no-op: {keys} changes nothing the engine sees (no rank's "
                           "argv, env or mounts): there is nothing to compare")
        if view in seen:
            raise BadInput(f"--variant {arm.name}" if arm.is_variant else f"--drafter {arm.name}",
                           f"boots the same engine as {seen[view]}: there is nothing to compare")
        seen[view] = arm.name


def prompts_of(source: str) -> PromptSet:
    return builtin_prompts() if source == BUILTIN_NAME else load_prompts(Path(source))


def campaign_template(cfg: Config, nodes: dict[str, Node], given: Path | None, say: Reporter = quiet) -> ChatTemplate:
    """The card protocol's chat template: ``--chat-template`` when given, else the target's own — read here
    when this machine has the target, else from the head (as `bench` does from a laptop, issue 41; cached by
    the target's manifest, so the campaign's spec names a local copy that `--resume` reads again)."""
    if given is None and needs_remote_template(cfg):
        given = head_template_dir(cfg, nodes[cfg.head.name], say=say)
    return target_template(cfg, given)


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
    for name, settings in req.variants:
        arm = _variant_arm(cfg, nodes, name, settings, say)
        arms.append(arm)
        drafter = f"drafter {arm.source} ({arm.digest[:12]})" if arm.source else (
            f"the config's drafter {arm.node_path}" if arm.node_path else "no drafter (mtp)")
        say(f"ab: variant {name} = {settings_text(settings)} (config {arm.fingerprint[:12]}, {drafter})")
    check_no_op(cfg, arms)
    cells = [c.name for c in req.cells]
    sampling = sampling_for(req.protocol).as_dict()
    if req.protocol == CARD:
        tpl = campaign_template(cfg, nodes, req.chat_template, say)
        sampling |= {"chat_template": tpl.source, "chat_template_sha256": tpl.sha256}
    primary = req.primary or (DEFAULT_PRIMARY if DEFAULT_PRIMARY in cells else cells[0])
    seed = req.seed if req.seed is not None else random.SystemRandom().randrange(1 << 31)
    return CampaignSpec(
        drafters=arms, cells=req.cells, rounds=req.rounds, seed=seed, prompts_source=prompt_set.source,
        prompts_sha256=prompt_set.sha256, config_sha256=cfg.fingerprint(),
        rule=Rule(baseline=arms[0].name, primary=primary), bootstrap=req.bootstrap, sampling=sampling,
        design=req.design, tuning=req.tuning,
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
    with journal_open() as j:
        status, spec, boots, waves = load_campaign(j, campaign_id)
    return build_report(campaign_id, status, spec, waves, boots)


def check_resume(cfg: Config, campaign_id: int) -> CampaignSpec:
    """Whether campaign ``campaign_id`` can resume with this config (journal, config, prompts and drafter
    digests as it started): its spec, or BadInput — before any node is touched."""
    with journal_open() as j:
        status, spec, _, _ = load_campaign(j, campaign_id)
    if status == "done":
        raise BadInput("--resume", f"campaign {campaign_id} is done: `sparkserve ab report {campaign_id}`")
    if cfg.fingerprint() != spec.config_sha256:
        raise BadInput("--resume", f"campaign {campaign_id} ran config {spec.config_sha256[:12]}, this is "
                       f"{cfg.fingerprint()[:12]}: resume it with the same config")
    prompt_set = prompts_of(spec.prompts_source)
    if prompt_set.sha256 != spec.prompts_sha256:
        raise BadInput(spec.prompts_source, f"changed since campaign {campaign_id} started (sha256 "
                       f"{prompt_set.sha256[:12]}, was {spec.prompts_sha256[:12]})")
    campaign_sampling(spec, campaign_id)
    for arm in spec.drafters:
        if arm.is_variant and variant_config(cfg, arm.settings, where=f"variant {arm.name}").fingerprint() != \
                arm.fingerprint:
            raise BadInput(f"variant {arm.name}", f"makes another config than when campaign {campaign_id} started "
                           f"(fingerprint {str(arm.fingerprint)[:12]})")
        if not arm.source:
            continue
        src = Path(arm.source)
        if not src.is_dir() or manifest(src).digest != arm.digest:
            raise BadInput(f"drafter {arm.name}", f"{src} is not the directory campaign {campaign_id} started "
                           f"with (digest {arm.digest[:12]})")
    return spec
