"""Pre-flight rules: everything that can be known wrong before any node is touched.

Each rule yields one Finding (``where``: the config field or file, ``what``: one sentence). Errors stop
the deploy (BadInput, exit 2); warnings are printed and the deploy goes on. Rules never cascade: a rule
whose inputs are missing (no weights, no target) stays silent and the missing input is its own error.

    report = validate(cfg); report.raise_first()   # config, drafter, target, every argv: BadInput for the first

Here: the rules on the config alone, the engine dialect, serve.extra_args and every argv, and :func:`validate`,
which runs them with the rules on the models (:mod:`sparkserve.plan.model_checks`) into one
:class:`~sparkserve.plan.findings.Report` (:mod:`sparkserve.plan.findings`).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

from sparkserve.config import API_KEY_ENV, Config
from sparkserve.errors import BadInput
from sparkserve.models.drafter import inspect_drafter
from sparkserve.models.target import inspect_target
from sparkserve.plan.build import build_plan
from sparkserve.plan.dialects import Dialect, dialect_for
from sparkserve.plan.findings import Report
from sparkserve.plan.model_checks import check_drafter, check_target, check_target_complete
from sparkserve.plan.profile_checks import check_identity, check_profile, uses_drafter
from sparkserve.plan.vllm_args import OptionList, ParserUnavailable, RealParser, get_judge

GMU_WARN_ABOVE = 0.85
MAX_NUM_SEQS = 512  # the fork's 512 Mamba/KDA state blocks (third-party summary of the W4A16 card, 2026-12-07 read)
# The card's launcher@1c142c9 picks its flag dialect from the image tag: `*v1-w4a16*` → v1 (upstream nightly base:
# --kv-cache-memory-bytes AND --no-enable-flashinfer-autotune), anything else → v2 (the fork). Its README@1c142c9
# ("Known failures") says the v1 base "dies at FlashInfer sparse-MLA warmup".
V1_TAG = "*v1-w4a16*"
V1_WHY = ("the card's v1 image (upstream nightly base, launcher@1c142c9 \"EXPERIMENTAL\"), which the card's README "
          "calls broken on SM121: it \"dies at FlashInfer sparse-MLA warmup … Failed to run MLA, error: invalid "
          "argument — with AND without --no-enable-flashinfer-autotune\"; its launcher flag dialect (v1: "
          "--kv-cache-memory-bytes and --no-enable-flashinfer-autotune) is not rendered by sparkserve, so the image is "
          "refused rather than half-served; use the v2 image ghcr.io/canada-quant/vllm-glm53-flash-sm121:"
          "v2-w4a16-dflash2e (the fork)")
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
    if s.max_num_seqs is not None and s.max_num_seqs > MAX_NUM_SEQS:
        r.error("serve.max_num_seqs", f"{s.max_num_seqs} is above {MAX_NUM_SEQS}: the card's fork refuses it (it "
                f"holds {MAX_NUM_SEQS} Mamba/KDA state blocks); the card's launcher serves 6")
    check_card_image(cfg, r)
    check_dialect(cfg, r)
    _check_extra_args(cfg, r)
    check_profile(cfg, r)
    return r


def check_card_image(cfg: Config, r: Report) -> None:
    """The card's v1 image tag (``*v1-w4a16*``) is refused with the card's reason: sparkserve renders one flag
    dialect per image, and the v1 one (two flags) for an image the card calls broken would be a boot that dies at
    warm-up, or half that dialect."""
    if cfg.runtime == "docker" and fnmatchcase(cfg.image.ref, V1_TAG):
        r.error("image.ref", f"{cfg.image.ref} is {V1_WHY}")


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
    check_card_image(cfg, r)
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
