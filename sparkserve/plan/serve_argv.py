"""Every rank's argv: ``vllm serve`` with the engine arguments identical on every rank (in the card's
launcher's order, in the image's flag dialect), mp's rendezvous flags per rank, or Ray's ``ray start`` and
the head's ``vllm serve`` once the workers joined — the one place a vLLM argv is built.

Pure: no I/O."""

from __future__ import annotations

import json

from sparkserve.config import Config, NodeConfig
from sparkserve.config.profiles import uses_drafter
from sparkserve.models.hf_cache import mount_for
from sparkserve.plan.dialects import Dialect, dialect_for
from sparkserve.plan.mounts import DRAFTER_MOUNT, TARGET_MOUNT

RAY_PORT = 6379


def model_paths(cfg: Config) -> tuple[str, str]:
    """(target, drafter) as the engine sees them: the container's mount points, or (runtime process) the
    host paths themselves."""
    if cfg.runtime == "process":
        return str(cfg.model.target), str(cfg.drafter.path) if cfg.drafter else ""
    # a Hugging Face cache snapshot is mounted with its repo dir (its links into blobs/ must resolve); the
    # drafter too (`weights pull` leaves both in the cache)
    drafter = mount_for(str(cfg.drafter.path), DRAFTER_MOUNT)[1] if cfg.drafter else DRAFTER_MOUNT
    return mount_for(str(cfg.model.target), TARGET_MOUNT)[1], drafter


def drafter_in_argv(argv: list[str]) -> str | None:
    """The drafter path a ``vllm serve`` argv names (``--speculative-config``'s ``model``), or None."""
    for i, a in enumerate(argv):
        text = a.partition("=")[2] if a.startswith("--speculative-config=") else (
            argv[i + 1] if a == "--speculative-config" and i + 1 < len(argv) else None)
        if text is None:
            continue
        try:
            model = json.loads(text).get("model")
        except (ValueError, AttributeError):
            return None
        return str(model) if model else None
    return None


def speculative_json(cfg: Config) -> str:
    spec: dict[str, object] = {
        "method": cfg.speculative.method,  # always explicit (auto-detection needs "dflash" in the path)
        **({"model": model_paths(cfg)[1]} if uses_drafter(cfg) else {}),  # mtp: vLLM drafts with the target
        "num_speculative_tokens": cfg.speculative.num_speculative_tokens,
    }
    if cfg.speculative.attention_backend:
        spec["attention_backend"] = cfg.speculative.attention_backend
    return json.dumps(spec, separators=(",", ":"))


def compilation_json(cfg: Config) -> str:
    comp = cfg.serve.compilation
    return json.dumps(
        {"cudagraph_mode": comp.cudagraph_mode.value, "cudagraph_capture_sizes": comp.cudagraph_capture_sizes},
        separators=(",", ":"),
    )


def kv_bytes_flag(dialect: Dialect) -> str:
    """The flag that pins the KV pool in this dialect (0.33: --kv-cache-memory-bytes; the card's fork:
    --kv-cache-memory). A dialect with neither renders the upstream name, which validate then refuses."""
    return dialect.kv_flag or "--kv-cache-memory-bytes"


def engine_args(cfg: Config, dialect: Dialect | None = None) -> list[str]:
    """Arguments identical on every rank (the part rank parity compares), in the card's launcher's order."""
    s = cfg.serve
    d = dialect or dialect_for(cfg)
    argv = [model_paths(cfg)[0], "--served-model-name", cfg.model.served_name]
    if s.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    argv += ["--gpu-memory-utilization", repr(s.gpu_memory_utilization), "--max-model-len", str(s.max_model_len)]
    if s.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.block_size is not None:
        argv += ["--block-size", str(s.block_size)]
    argv += ["--speculative-config", speculative_json(cfg)]
    argv += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.kv_cache_memory_bytes is not None:  # the exact integer: the engine gets the bytes the pool was banked at
        argv += [kv_bytes_flag(d), str(s.kv_cache_memory_bytes)]
    if s.enforce_eager:
        argv.append("--enforce-eager")
    else:
        argv += ["--compilation-config", compilation_json(cfg)]
    if s.attention_backend:
        argv += ["--attention-backend", s.attention_backend]
    if s.tool_call_parser:
        argv += ["--tool-call-parser", s.tool_call_parser]
    if s.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if s.reasoning_parser:
        argv += ["--reasoning-parser", s.reasoning_parser]
    if s.default_chat_template_kwargs is not None:
        argv += ["--default-chat-template-kwargs", json.dumps(s.default_chat_template_kwargs, separators=(",", ":"))]
    argv += list(s.extra_args)
    return argv


def mp_argv(cfg: Config, rank: int, dialect: Dialect) -> list[str]:
    argv = ["vllm", "serve", *engine_args(cfg, dialect)]
    if len(cfg.nodes) == 1:  # one node: vLLM alone on it, no rendezvous
        if cfg.serve.host:
            argv += ["--host", cfg.serve.host]
        return [*argv, "--port", str(cfg.serve.port)]
    argv += [
        "--distributed-executor-backend", "mp",
        "--nnodes", str(len(cfg.nodes)),
        "--node-rank", str(rank),
        "--master-addr", cfg.head.fabric_ip,
        "--master-port", str(cfg.fabric.master_port),
    ]
    if rank == 0:
        if cfg.serve.host:
            argv += ["--host", cfg.serve.host]
        argv += ["--port", str(cfg.serve.port)]
    else:
        argv.append("--headless")
    return argv


def ray_serve_argv(cfg: Config, dialect: Dialect) -> list[str]:
    argv = ["vllm", "serve", *engine_args(cfg, dialect), "--distributed-executor-backend", "ray"]
    if cfg.serve.host:
        argv += ["--host", cfg.serve.host]
    argv += ["--port", str(cfg.serve.port)]
    return argv


def ray_start_argv(cfg: Config, node: NodeConfig, rank: int) -> list[str]:
    if rank == 0:
        return ["ray", "start", "--head", f"--node-ip-address={node.fabric_ip}", f"--port={RAY_PORT}",
                "--num-gpus", str(node.gpus), "--block"]
    return ["ray", "start", f"--address={cfg.head.fabric_ip}:{RAY_PORT}",
            f"--node-ip-address={node.fabric_ip}", "--num-gpus", str(node.gpus), "--block"]

