"""Pre-flight rules: everything that can be known wrong before any node is touched.

Each rule yields one Finding (``where``: the config field or file, ``what``: one sentence). Errors stop
the deploy (BadInput, exit 2); warnings are printed and the deploy goes on. Rules never cascade: a rule
whose inputs are missing (no weights, no target) stays silent and the missing input is its own error.

    report = validate(cfg); report.raise_first()   # config, drafter, target, every argv: BadInput for the first
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkserve.config import API_KEY_ENV, Config
from sparkserve.errors import BadInput
from sparkserve.models.completeness import Completeness, check_completeness, summary
from sparkserve.models.drafter import (
    ARCHITECTURES_BY_VLLM,
    CONV_RE,
    DFLASH2_REQUIRED_KEYS,
    KNOWN_ARCHITECTURES,
    MASK_FILE,
    SELECTOR_RE,
    DrafterFacts,
    inspect_drafter,
)
from sparkserve.models.files import read_config
from sparkserve.models.target import TargetFacts, inspect_target
from sparkserve.plan.build import build_plan
from sparkserve.plan.dialects import Dialect, dialect_for
from sparkserve.plan.profile_checks import check_identity, check_profile, uses_drafter
from sparkserve.plan.vllm_args import OptionList, ParserUnavailable, RealParser, get_judge

GMU_WARN_ABOVE = 0.85
ParserMode = Literal["auto", "vllm", "list", "none"]

# dest of a flag sparkserve renders → the config field that sets it (for serve.extra_args conflicts)
RENDERED_FROM = {
    "model_tag": "model.target", "served_model_name": "model.served_name",
    "tensor_parallel_size": "serve.tensor_parallel_size", "enable_expert_parallel": "serve.enable_expert_parallel",
    "max_model_len": "serve.max_model_len", "max_num_seqs": "serve.max_num_seqs",
    "kv_cache_dtype": "serve.kv_cache_dtype", "gpu_memory_utilization": "serve.gpu_memory_utilization",
    "kv_cache_memory_bytes": "serve.kv_cache_memory_bytes", "compilation_config": "serve.compilation",
    "enforce_eager": "serve.enforce_eager", "attention_backend": "serve.attention_backend",
    "speculative_config": "speculative", "distributed_executor_backend": "serve.executor",
    "block_size": "serve.block_size", "trust_remote_code": "serve.trust_remote_code",
    "tool_call_parser": "serve.tool_call_parser", "enable_auto_tool_choice": "serve.enable_auto_tool_choice",
    "reasoning_parser": "serve.reasoning_parser", "default_chat_template_kwargs": "serve.default_chat_template_kwargs",
    "kv_cache_memory": "serve.kv_cache_memory_bytes",
    "nnodes": "nodes", "node_rank": "nodes", "master_addr": "nodes[0].fabric_ip",
    "master_port": "fabric.master_port", "headless": "nodes", "host": "serve.host", "port": "serve.port",
}


@dataclass
class Finding:
    where: str
    what: str


@dataclass
class Report:
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    drafter: DrafterFacts | None = None
    target: TargetFacts | None = None
    argv_judge: str | None = None
    argvs_checked: int = 0
    completeness: dict[str, Completeness] = field(default_factory=dict)  # "drafter" / "target"
    drafter_identity: dict[str, str | None] | None = None  # which of the card's drafters (plan.profile_checks)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, where: str, what: str) -> None:
        self.errors.append(Finding(where, what))

    def warn(self, where: str, what: str) -> None:
        self.warnings.append(Finding(where, what))

    def raise_first(self) -> None:
        """Raise BadInput for the first error (one line; the count of the others appended)."""
        if not self.errors:
            return
        first, more = self.errors[0], len(self.errors) - 1
        plural = "s" if more > 1 else ""
        suffix = f" (and {more} more problem{plural}; `sparkserve validate` lists them)" if more else ""
        raise BadInput(first.where, first.what + suffix)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": [asdict(f) for f in self.errors],
            "warnings": [asdict(f) for f in self.warnings],
            "drafter": self.drafter.to_json() if self.drafter else None, "drafter_identity": self.drafter_identity,
            "target": self.target.to_json() if self.target else None,
            "argv_judge": self.argv_judge,
            "argvs_checked": self.argvs_checked,
        }


# --- config ------------------------------------------------------------------------------------------------

def check_config(cfg: Config, report: Report | None = None) -> Report:
    """Rules on the config alone (pydantic already refused malformed values when it was loaded)."""
    r, s = report or Report(), cfg.serve
    nodes = cfg.nodes[: len(cfg.nodes) // cfg.replicas]  # replicas: each equal group is one stack
    gpus = sum(n.gpus for n in nodes)
    if s.tensor_parallel_size != gpus:
        per = {n.gpus for n in nodes}
        how = f"{len(nodes)} nodes x {per.pop()} GPU" if len(per) == 1 else f"{gpus} GPUs over {len(nodes)} nodes"
        r.error("serve.tensor_parallel_size", f"{s.tensor_parallel_size} but the nodes hold {how} = {gpus}; "
                "TP must use every GPU of every node")
    if s.gpu_memory_utilization > GMU_WARN_ABOVE:
        r.warn("serve.gpu_memory_utilization", f"{s.gpu_memory_utilization} is above {GMU_WARN_ABOVE}: on unified "
               "memory the OS and page cache share the GPU's memory (the ruled value is 0.795)")
    if s.enforce_eager and s.compilation.cudagraph_mode.value != "NONE":
        r.warn("serve.enforce_eager", f"eager mode ignores serve.compilation (cudagraph_mode "
               f"{s.compilation.cudagraph_mode.value}); the graphs gate will expect no graphs")
    if cfg.container.shm_size is not None and cfg.runtime == "docker":
        r.warn("container.shm_size", "ignored: the containers run with --ipc=host, so /dev/shm is the host's "
               "(docker drops --shm-size); size the host's /dev/shm instead")
    check_dialect(cfg, r)
    _check_extra_args(cfg, r)
    check_profile(cfg, r)
    return r


def check_dialect(cfg: Config, r: Report, dialect: Dialect | None = None) -> None:
    """Every setting the plan renders must be a flag of the image's engine dialect: one it cannot express
    is refused here, naming the field and the image (the plan never renders a flag the engine lacks but for
    these, so the refusal comes before any node is touched)."""
    d = dialect or dialect_for(cfg)
    plan = build_plan(cfg, dialect=d)
    argv = plan.head.serve_argv()
    if argv[:2] != ["vllm", "serve"]:
        return
    options = OptionList.load(version=d)
    extra = {a.split("=", 1)[0] for a in cfg.serve.extra_args}
    image = cfg.image.ref if cfg.runtime == "docker" else f"serve.vllm {cfg.serve.vllm}"
    for a in argv[3:]:
        if not a.startswith("--") or a.split("=", 1)[0] in extra or d.accepts(a):
            continue  # serve.extra_args are judged whole by the argv check, as written
        found = options.by_flag.get(a)
        field = RENDERED_FROM.get(found["dest"] if found else a[2:].replace("-", "_"), "plan")
        r.error(field, f"{a} cannot be expressed by {image}'s engine: its dialect, vLLM {d.vllm_version} "
                f"({d.source}), has no {a} (set serve.vllm_version to override the dialect, or leave {field} unset)")


def refuse_inexpressible(cfg: Config, dialect: Dialect) -> None:
    """BadInput (exit 2) naming the first setting ``dialect`` cannot express: ``up`` calls it once the image
    ID is known, before any container starts (the image's stored facts may have named another dialect)."""
    r = Report()
    check_dialect(cfg, r, dialect)
    r.raise_first()


def _check_extra_args(cfg: Config, r: Report) -> None:
    if not cfg.serve.extra_args:
        return
    options = OptionList.load(version=dialect_for(cfg))
    for a in cfg.serve.extra_args:
        if not a.startswith("-"):
            continue
        flag = a.split("=", 1)[0]
        if flag.startswith("--"):
            flag = "--" + flag[2:].split(".", 1)[0].replace("_", "-")
        try:
            found = options.lookup(flag)
        except Exception:
            found = None
        dest = found[1]["dest"] if found else None
        if dest == "api_key":
            r.error("serve.extra_args", f"{a}: an API key never goes into an argv (it is logged and visible in "
                    f"`ps`); set serve.api_key_env or serve.api_key_file (passed as {API_KEY_ENV})")
        elif dest in RENDERED_FROM:
            r.error("serve.extra_args", f"{a} is rendered by sparkserve from {RENDERED_FROM[dest]}; set it there")


# --- drafter -----------------------------------------------------------------------------------------------

def check_drafter(cfg: Config, d: DrafterFacts, r: Report) -> None:
    """Every rule on the drafter alone and against the config: kind, mask token and file, K, DFlash2
    structure, taps."""
    cfg_file = str(Path(d.path) / "config.json")
    for check in (_check_kind, _check_mask, _check_k_rule, _check_sampling, _check_dflash2, _check_taps,
                  _check_drafter_complete):
        check(cfg, d, r, cfg_file)


def _check_kind(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """A DFlash drafter vLLM 0.33 knows, and the inspection's own problems."""
    if not d.known:
        known = ", ".join(KNOWN_ARCHITECTURES)
        if d.format == "speculators":
            r.error(cfg_file, f"speculators_model_type {d.architecture.split(':', 1)[-1] if d.architecture else None!r}"
                    " is not a DFlash drafter (vLLM 0.33 converts only dflash and dflash2)")
        else:
            r.error(cfg_file, f"architectures {d.architectures} is not a DFlash drafter vLLM 0.33 knows ({known})")
    version = dialect_for(cfg).vllm_version
    by_version = ARCHITECTURES_BY_VLLM.get(version)  # None: a build (the card's fork) sparkserve has no list for
    if d.known and by_version is not None and not any(a in by_version for a in d.architectures):
        r.error(cfg_file, f"architectures {d.architectures}: vLLM {version} (the engine's dialect) registers only "
                f"{', '.join(by_version)}")
    for p in d.problems:
        r.error(p.where, p.what)


def _check_mask(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """The mask token: drafter config, ``mask_embedding.pt`` and the gates agree, and the file is there."""
    if d.mask_token_id is None:
        r.error(cfg_file, "dflash_config.mask_token_id is missing (vLLM refuses a DFlash drafter without it)")
    elif d.vocab_size is not None and not 0 <= d.mask_token_id < d.vocab_size:
        r.error(cfg_file, f"{d.mask_token_id_source} {d.mask_token_id} is outside the vocabulary (vocab_size "
                f"{d.vocab_size})")
    mask_file = str(Path(d.path) / MASK_FILE)
    if not d.mask.present:
        r.error("drafter.path", f"{d.path} has no {MASK_FILE}: vLLM would silently use the embedding row of "
                "mask_token_id instead of the trained mask (do not serve)")
    elif d.mask.error:
        r.error(mask_file, d.mask.error)
    else:
        if d.mask.mask_token_id is not None and d.mask_token_id is not None and d.mask.mask_token_id != d.mask_token_id:
            r.error(mask_file, f"mask_token_id {d.mask.mask_token_id} but config.json {d.mask_token_id_source} is "
                    f"{d.mask_token_id} (vLLM refuses the pair)")
        shape = d.mask.embedding_shape or []
        if d.hidden_size and math.prod(shape) != d.hidden_size:
            r.error(mask_file, f"embedding of shape {shape} cannot be reshaped to the drafter's hidden_size "
                    f"{d.hidden_size}")
    gate_id = cfg.gates.mask_token_id
    if gate_id is not None and d.mask_token_id is not None and gate_id != d.mask_token_id:
        r.error("gates.mask_token_id", f"{gate_id} but the drafter's {d.mask_token_id_source} is {d.mask_token_id}")


def _check_k_rule(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """K against block_size: K > block_size − 1 is an error for DFlash2 (a block holds the anchor and block_size − 1
    masked slots); a smaller K boots (drafter card GLM-5.3-Flash-DFlash2-E.md, "Hard constraints"): a warning."""
    k, b = cfg.speculative.num_speculative_tokens, d.block_size
    if b is None and d.kind == "dflash2":
        r.warn(cfg_file, "dflash_config.block_size is missing: cannot check num_speculative_tokens against it")
    elif b is not None and k != b - 1:
        what = f"{k} but the drafter's block_size is {b}"
        if d.kind == "dflash2" and k > b - 1:
            r.error("speculative.num_speculative_tokens", f"{what}: a block drafts at most block_size - 1 = {b - 1}")
        elif d.kind == "dflash2":
            r.warn("speculative.num_speculative_tokens", f"{what}: the drafter card trained and measured K = "
                   f"block_size - 1 = {b - 1}; fewer boot on the SM121 image (the card: k=5, not benchmarked; "
                   "its K=4 column is from H200)")
        else:
            r.warn("speculative.num_speculative_tokens", what + ": the convention is K = block_size - 1 (not enforced)")
    if d.speculative_tokens is not None and d.speculative_tokens != k:
        r.warn("speculative.num_speculative_tokens", f"{k} but the speculators config proposes {d.speculative_tokens}")


def _check_sampling(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """Draft sampling options vLLM 0.33 refuses for DFlash."""
    if d.sample_from_anchor:
        r.error(cfg_file, "dflash_config.sample_from_anchor is true; vLLM 0.33 does not support it for DFlash")


def _check_dflash2(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """DFlash2's structure: its config keys, selector and convolution tensors, the V2 runner."""
    if d.kind == "dflash2":
        missing = [k_ for k_ in DFLASH2_REQUIRED_KEYS if d.dflash_config.get(k_) is None]
        if missing:
            r.error(cfg_file, f"dflash_config lacks {', '.join(missing)} (a DFlash2 drafter needs them; vLLM fails "
                    "with KeyError)")
        g, h = d.conv_group_size, d.hidden_size
        if g is not None and h and (g <= 0 or h % g):
            r.error(cfg_file, f"dflash_config.conv_group_size={g} must divide hidden_size={h}")
        if d.weights:
            if d.weights.selector_tensors != 3:
                r.error("drafter.path", f"{d.weights.selector_tensors} candidate_selector tensors in the weights; a "
                        "DFlash2 drafter has 3 (predecessor/successor codebook, hidden_projection)")
            layers = d.num_hidden_layers or 0
            if layers and d.weights.conv_tensors != 4 * layers:
                r.error("drafter.path", f"{d.weights.conv_tensors} convolution tensors in the weights; a DFlash2 "
                        f"drafter with {layers} layers has {4 * layers}")
        mode = cfg.serve.env.get("VLLM_USE_V2_MODEL_RUNNER")
        if mode is not None and mode.strip() == "0":
            r.error("serve.env.VLLM_USE_V2_MODEL_RUNNER", "0 forces the V1 runner, which refuses DFlash2 "
                    "candidate-head drafts")
    if d.weights and d.weights.mask_hidden_tensors:
        r.error("drafter.path", f"the weights ship {d.weights.mask_hidden_tensors[0]}; vLLM asserts DFlash drafters "
                "carry no mask_hidden weight")


def _check_taps(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """Taps: target_layer_ids against the fc projection's input width (a missing fc.weight is the
    completeness rule's, _check_drafter_complete)."""
    if d.target_layer_ids is None:
        r.error(cfg_file, "dflash_config.target_layer_ids is missing (which target layers feed the drafter?)")
    elif d.weights and d.use_aux_hidden_state:
        width, th = d.weights.fc_input_width, d.target_hidden_size
        taps = len(d.target_layer_ids)
        if width is not None and th and width != th * taps:
            trained = f"{width // th} taps" if width % th == 0 else f"not a multiple of {th}"
            r.error(cfg_file, f"dflash_config.target_layer_ids lists {taps} layers but fc.weight's input width is "
                    f"{width} ({trained} x target_hidden_size {th})")


def _check_drafter_complete(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """Every tensor the drafter's config implies is in its safetensors headers (real vLLM boots without one,
    silently). Names an earlier rule already counted (DFlash2 selector, convolutions) are not named twice."""
    if d.problems or not d.weights:  # unreadable or missing weights are the inspection's own errors
        return
    ccfg = {"num_hidden_layers": d.num_hidden_layers,
            "dflash_config": {**d.dflash_config, "use_aux_hidden_state": d.use_aux_hidden_state}}
    c = check_completeness(d.path, ccfg, role="drafter", architectures=d.architectures)
    said: list[re.Pattern[str]] = []
    if d.kind == "dflash2" and d.weights.selector_tensors != 3:
        said.append(SELECTOR_RE)
    if d.kind == "dflash2" and d.num_hidden_layers and d.weights.conv_tensors != 4 * d.num_hidden_layers:
        said.append(CONV_RE)
    c.missing = [m for m in c.missing if not any(rx.search(m) for rx in said)]
    report_completeness(c, "drafter.path", r)
    r.completeness["drafter"] = c


def report_completeness(c: Completeness, where: str, r: Report) -> None:
    """A Completeness as findings: each missing shard or unreadable header, the missing tensors (one
    error naming the first few), extra tensors and the conservative rule (warnings)."""
    for shard in c.missing_shards:
        r.error(str(Path(c.path) / shard), "missing (listed in model.safetensors.index.json)")
    for f, what in c.unreadable:
        r.error(f, what)
    if c.missing:
        r.error(where, f"{c.path} lacks {len(c.missing)} tensor{'s' if len(c.missing) > 1 else ''} its config.json "
                f"implies: {summary(c.missing)} (vLLM boots such a checkpoint without a word and serves "
                f"uninitialised weights; rule: {c.rule})")
    if c.extra:
        r.warn(where, f"{c.path} holds {len(c.extra)} tensor{'s' if len(c.extra) > 1 else ''} its config.json "
               f"does not imply: {summary(c.extra)} (rule: {c.rule})")
    if c.conservative and not c.no_weights:
        r.warn(where, f"completeness of {c.path} checked by the {c.rule} rule only")


def check_target_complete(t: TargetFacts, r: Report) -> None:
    """Every tensor the target's config implies is in its safetensors headers (the shards of its index
    included). A directory without any safetensors file (a controller holding only config.json) is a
    warning: nothing to compare."""
    c = check_completeness(t.path, read_config(Path(t.path), where="model.target"), role="target",
                           architectures=t.architectures)
    if c.no_weights:
        r.warn("model.target", f"{t.path} has no *.safetensors here: checkpoint completeness not checked")
        return
    report_completeness(c, "model.target", r)
    r.completeness["target"] = c


def check_target(cfg: Config, d: DrafterFacts | None, t: TargetFacts, r: Report) -> None:
    check_max_model_len(cfg, t, r)
    if d is None:
        return
    cfg_file = str(Path(d.path) / "config.json")
    if d.target_hidden_size and d.target_hidden_size != t.hidden_size:
        r.error(cfg_file, f"target_hidden_size {d.target_hidden_size} but the target's hidden_size is "
                f"{t.hidden_size} ({t.path})")
    if d.target_layer_ids:
        bad = [i for i in d.target_layer_ids if not 0 <= i < t.num_hidden_layers]
        if bad:
            r.error(cfg_file, f"target_layer_ids has {bad[0]} but the target has {t.num_hidden_layers} layers "
                    f"(0..{t.num_hidden_layers - 1})")
    if d.vocab_size and t.vocab_size and d.vocab_size != t.vocab_size and not (d.weights and d.weights.has_d2t):
        r.warn(cfg_file, f"vocab_size {d.vocab_size} differs from the target's {t.vocab_size} and the weights "
               "carry no d2t map")


def check_max_model_len(cfg: Config, t: TargetFacts, r: Report) -> None:
    """As vLLM does at start-up (``_get_and_verify_max_len``): a max_model_len beyond the target's derived length
    is a ValueError, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (then vLLM only warns). Refused here, before boot."""
    derived, want = t.derived_max_model_len, cfg.serve.max_model_len
    if not want or derived is None or want <= derived:
        return
    scaled = f" x RoPE factor {t.rope_factor:g}" if t.rope_factor != 1 else ""
    what = (f"{want} is greater than the target's derived max_model_len {derived} (max_position_embeddings "
            f"{t.max_position_embeddings}{scaled}; {t.path})")
    if cfg.serve.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true"):
        r.warn("serve.max_model_len", what + "; allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN (RoPE positions past "
               "it give nan)")
    else:
        r.error("serve.max_model_len", what + "; vLLM refuses it (set serve.env VLLM_ALLOW_LONG_MAX_MODEL_LEN: "
                "\"1\" to override)")


# --- argv --------------------------------------------------------------------------------------------------

def check_argvs(cfg: Config, r: Report, judge: RealParser | OptionList) -> None:
    """Every `vllm serve` argv of the plan through the judge (vLLM's parser or the option list)."""
    plan = build_plan(cfg)
    r.argv_judge = judge.name
    for spec in plan.specs:
        argv = spec.serve_argv()
        if argv[:2] != ["vllm", "serve"]:
            continue
        v = judge.check(argv)
        r.argvs_checked += 1
        if not v.ok:
            flag = v.flag or ""
            where = "serve.extra_args" if any(a.split("=", 1)[0] == flag for a in cfg.serve.extra_args) else "plan"
            r.error(where, f"{judge.name} rejects {spec.role} {spec.node}'s argv: {v.error}")
            return


def validate(
    cfg: Config,
    *,
    drafter_dir: Path | str | None = None,
    target_dir: Path | str | None = None,
    parser: ParserMode = "auto",
    judge: RealParser | OptionList | None = None,
    read_drafter: bool = True,
    read_target: bool = True,
) -> Report:
    """All pre-flight rules. The drafter is read from ``drafter_dir``, else drafter.source, else drafter.path;
    the target from ``target_dir`` or model.target. The argv check runs last (it costs a vLLM start-up).
    ``read_drafter`` / ``read_target`` False: that model is not read (`validate --offline`); its rules are silent."""
    r = check_config(cfg)
    if read_drafter and cfg.drafter and uses_drafter(cfg):  # mtp: the target's own head, no drafter to read
        try:
            r.drafter = inspect_drafter(drafter_dir or cfg.drafter.source or cfg.drafter.path)
        except BadInput as e:
            r.error(e.where, e.what)
        else:
            check_drafter(cfg, r.drafter, r)
            r.drafter_identity = check_identity(cfg, r.drafter, r, str(cfg.drafter.path)).to_json()
    if read_target:
        try:
            r.target = inspect_target(target_dir or cfg.model.target)
        except BadInput as e:
            r.error(e.where, e.what)
        else:
            check_target(cfg, r.drafter, r.target, r)
            check_target_complete(r.target, r)
    if r.errors or parser == "none":
        return r
    if judge is not None:
        check_argvs(cfg, r, judge)
        return r
    try:
        j = get_judge(parser, dialect_for(cfg))  # "auto" falls back to the option list; "vllm" raises
    except ParserUnavailable as e:
        r.error("vllm", str(e))
        return r
    try:
        check_argvs(cfg, r, j)
    finally:
        if isinstance(j, RealParser):
            j.close()
    return r
