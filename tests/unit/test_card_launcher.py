"""`sparkserve render --json` of the default profile against the model card's banked "g4" launcher: every engine
arg, env var, container setting and mount of the launcher, each either rendered the same or listed as a
deliberate difference with its reason in docs/concepts/card-differences.md. 0 unexplained differences.

The table below was written by reading canada-quant/vllm-glm53-flash-sm121
``scripts/launch_glm53_w4a16_dflash2_sm121.sh`` at commit 1c142c954436 (its defaults: FLAVOR v2, GRAPHS=1), facts
only. It is the newest revision the store holds: its drafter default is ``/models/GLM-5.3-Flash-DFlash2-G`` ("the
previous releases -F / -E are drop-ins"), its knobs name the 800K profile (``MAX_MODEL_LEN=800000`` "with
KV_CACHE_MEM=17179869184 GMU=0.90; validated with -G") and it passes ``--shm-size 32g`` beside ``--ipc host``.
(The revision stored as f68aece is an older one: ``-E`` default, the v1 image, no 800K knobs.)
The config is the embedded default with the fabric pinned to the launcher's values (interface
enp1s0f1np1, HCA rocep1s0f1, GID 3, fabric IPs 192.168.102.1/.2, master port 29521).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from _fixtures import REPO, config_file

TARGET, DRAFTER = "/srv/models/glm-5.3-w4a16-mtp", "/srv/models/GLM-5.3-Flash-DFlash2-G"
CARD_DRAFTER_DEFAULT = "/models/GLM-5.3-Flash-DFlash2-G"  # DRAFTER_HOST_PATH's default
# the launcher's knobs for its other validated context (MAX_MODEL_LEN=800000 KV_CACHE_MEM=17179869184 GMU=0.90)
CARD_800K = {"--max-model-len": "800000", "--kv-cache-memory": "17179869184", "--gpu-memory-utilization": "0.9"}
HOST_IP = {0: "192.168.102.1", 1: "192.168.102.2"}

# --- the launcher's facts (read, not run) ------------------------------------------------------------------
CARD_DOCKER = {  # `docker run` options
    "--gpus": "all", "-d": None, "--name": "vllm_node", "--restart": "no", "--memory": "118g",
    "--network": "host", "--ipc": "host", "--shm-size": "32g", "--ulimit memlock": "-1:-1",
    "--cap-add": "IPC_LOCK", "--device": "/dev/infiniband:/dev/infiniband",
}
CARD_MOUNTS = {  # container path → (host path, read-only); the drafter's -v appears twice in the launcher
    "/models/glm53-w4a16": ("$MODEL_DIR", False),
    "/models/dflash2-draft": ("$DRAFTER_HOST_PATH", True),
    "/cache": ("/var/tmp/glm53-vllm-cache", False),
    "/root/.cache/flashinfer": ("/var/tmp/glm53-vllm-cache/flashinfer", False),
    "/root/.tilelang": ("/var/tmp/glm53-vllm-cache/tilelang", False),
}
CARD_ENV = {
    "HF_HOME": "/cache/huggingface", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "VLLM_ENGINE_READY_TIMEOUT_S": "3600", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_DISABLE_VERSION_CHECK": "1",
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "rocep1s0f1", "NCCL_IB_GID_INDEX": "3",
    "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ADDR_RANGE": "192.168.102.0/24",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1", "TP_SOCKET_IFNAME": "enp1s0f1np1",
    "MN_IF_NAME": "enp1s0f1np1",
    "NCCL_NVLS_ENABLE": "0", "NCCL_CROSS_NIC": "0", "NCCL_IB_MERGE_NICS": "0", "NCCL_CUMEM_ENABLE": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1", "NCCL_DEBUG": "WARN", "NCCL_BLOCKING_WAIT": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1800",
    "TORCH_NCCL_DISABLE_WATCHDOG": "1",
}  # plus VLLM_HOST_IP = the rank's fabric IP
CARD_IMAGE = "ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e"
CARD_MODEL = "/models/glm53-w4a16"


def card_args(rank: int) -> dict[str, str | None]:
    args: dict[str, str | None] = {
        "--served-model-name": "glm-5.3-flash", "--host": "0.0.0.0", "--port": "8000", "--trust-remote-code": None,
        "--tensor-parallel-size": "2", "--enable-expert-parallel": None, "--gpu-memory-utilization": "0.795",
        "--max-model-len": "262144", "--max-num-seqs": "6", "--block-size": "2304",
        "--speculative-config": '{"method":"dflash","model":"/models/dflash2-draft","num_speculative_tokens":7}',
        "--kv-cache-dtype": "fp8_e4m3", "--kv-cache-memory": "8053063680",
        "--compilation-config": '{"cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[1,2,4,8,16,24,32]}',
        "--tool-call-parser": "glm47", "--enable-auto-tool-choice": None, "--reasoning-parser": "glm45",
        "--default-chat-template-kwargs": '{"enable_thinking":true}', "--distributed-executor-backend": "mp",
        "--nnodes": "2", "--node-rank": str(rank), "--master-addr": "192.168.102.1", "--master-port": "29521",
    }
    if rank == 1:
        args["--headless"] = None
    return args


# --- every difference, with the heading of its reason in docs/concepts/card-differences.md ---------------
EXPLAINED = {
    "model path": "Mount points",
    "mount /models/glm53-w4a16": "Mount points",
    "mount /models/target": "Mount points",
    "mount /models/dflash2-draft": "Mount points",
    "mount /models/drafter": "Mount points",
    "arg --speculative-config": "Mount points",
    "mount /cache": "Caches",
    "mount /root/.cache/flashinfer": "Caches",
    "mount /root/.tilelang": "Caches",
    "mount /root/.cache/vllm": "Caches",
    "mount /root/.triton": "Caches",
    "mount /root/.deep_gemm": "Caches",
    "env DG_JIT_CACHE_DIR": "Caches",
    "arg --host": "The API address",
    "arg --port": "The API address",
    "docker --ulimit core": "Core dumps",
    "docker --name": "Container names, labels, entrypoint",
    "docker --label": "Container names, labels, entrypoint",
    "docker --stop-timeout": "Container names, labels, entrypoint",
    "docker --entrypoint": "Container names, labels, entrypoint",
    "env NCCL_DEBUG": "NCCL debug output in the boot window",
    "env NCCL_DEBUG_SUBSYS": "NCCL debug output in the boot window",
    "env UCX_NET_DEVICES": "UCX",
}
DOC = REPO / "docs" / "concepts" / "card-differences.md"


def _split_argv(argv: list[str]) -> tuple[str | None, dict[str, str | None]]:
    """(the positional model, {flag: value or None for a switch}) of a `vllm serve` argv."""
    model, flags, i = None, {}, 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            model = a
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[a] = argv[i + 1]
            i += 2
        else:
            flags[a] = None
            i += 1
    return model, flags


def _docker_opts(argv: list[str]) -> dict[str, str | None]:
    """Our `docker run` options up to the image, keyed like CARD_DOCKER (``--ulimit NAME``; -e/--mount apart)."""
    out: dict[str, str | None] = {}
    i = 2
    while i < len(argv):
        a = argv[i]
        if a == "--entrypoint":
            out[a] = argv[i + 1]
            break
        if a in ("-e", "--mount"):
            i += 2
            continue
        if "=" in a and a.startswith("--"):
            k, v = a.split("=", 1)
            out[k] = v
            i += 1
        elif a == "-d":
            out[a] = None
            i += 1
        elif a == "--ulimit":
            name, v = argv[i + 1].split("=", 1)
            out[f"--ulimit {name}"] = v
            i += 2
        elif a == "--label":
            out["--label"] = "sparkserve's labels"
            i += 2
        else:
            v = argv[i + 1]
            out[a] = f"{v}:{v}" if a == "--device" and ":" not in v else v
            i += 2
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("card")
    cfg = config_file(tmp / "sparkserve.yaml", {
        "nodes": [{"name": "spark-a", "host": "10.0.0.1", "fabric_ip": HOST_IP[0], "user": "ubuntu"},
                  {"name": "spark-b", "host": "10.0.0.2", "fabric_ip": HOST_IP[1], "user": "ubuntu"}],
        "fabric": {"interface": "enp1s0f1np1", "hca": "rocep1s0f1", "gid_index": 3, "master_port": 29521},
        "model": {"target": TARGET}, "drafter": {"path": DRAFTER},
    })
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_") or k == "SPARKSERVE_IMAGE_FACTS"}
    p = subprocess.run([sys.executable, "-m", "sparkserve", "render", "--json", "-c", str(cfg)], capture_output=True,
                       text=True, timeout=120, env={**env, "PYTHONPATH": str(REPO)}, cwd=tmp)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def differences(plan: dict[str, Any]) -> list[tuple[str, int, object, object]]:
    """(key, rank, the launcher's, ours) for everything that is not the same."""
    out: list[tuple[str, int, object, object]] = []
    for spec in plan["specs"]:
        r = spec["rank"]
        assert spec["image"] == CARD_IMAGE
        model, args = _split_argv(spec["command"][2:])
        if model != CARD_MODEL:
            out.append(("model path", r, CARD_MODEL, model))
        want = card_args(r)
        for k in sorted(set(want) | set(args)):
            if want.get(k, "<absent>") != args.get(k, "<absent>"):
                out.append((f"arg {k}", r, want.get(k, "<absent>"), args.get(k, "<absent>")))
        env = spec["env"]
        card_env = {**CARD_ENV, "VLLM_HOST_IP": HOST_IP[r]}
        for k in sorted(set(card_env) | set(env)):
            if card_env.get(k) != env.get(k):
                out.append((f"env {k}", r, card_env.get(k), env.get(k)))
        ours = _docker_opts(spec["docker_run"])
        for k in sorted(set(CARD_DOCKER) | set(ours)):
            if CARD_DOCKER.get(k, "<absent>") != ours.get(k, "<absent>"):
                out.append((f"docker {k}", r, CARD_DOCKER.get(k, "<absent>"), ours.get(k, "<absent>")))
        mounts = {m["target"]: (m["source"], m["read_only"]) for m in spec["mounts"]}
        for t in sorted(set(CARD_MOUNTS) | set(mounts)):
            if CARD_MOUNTS.get(t) != mounts.get(t):
                out.append((f"mount {t}", r, CARD_MOUNTS.get(t), mounts.get(t)))
    return out


def test_render_json_has_no_unexplained_difference_from_the_card_launcher(rendered: dict[str, Any]) -> None:
    diffs = differences(rendered)
    unexplained = [d for d in diffs if d[0] not in EXPLAINED]
    assert unexplained == [], "\n".join(f"{k} (rank {r}): card {c!r}, sparkserve {o!r}" for k, r, c, o in unexplained)
    stale = sorted(set(EXPLAINED) - {d[0] for d in diffs})
    assert stale == [], f"explained differences that are no longer differences: {stale}"


def test_every_difference_is_explained_in_the_docs() -> None:
    text = DOC.read_text()
    headings = {ln.lstrip("#").strip() for ln in text.splitlines() if ln.startswith("## ")}
    assert set(EXPLAINED.values()) <= headings, sorted(set(EXPLAINED.values()) - headings)
    for key in EXPLAINED:
        thing = key.split(" ", 1)[1]
        assert f"`{thing}`" in text or thing in text, f"{key}: not named in {DOC.name}"


def test_the_card_values_that_matter_most_are_exact(rendered: dict[str, Any]) -> None:
    """The ones issue 21 found wrong: KV bytes, the fork's flag, block size, seqs, the env that kept boots alive."""
    for spec in rendered["specs"]:
        _, args = _split_argv(spec["command"][2:])
        assert args["--kv-cache-memory"] == "8053063680" and "--kv-cache-memory-bytes" not in args  # never 8G
        assert (args["--block-size"], args["--max-num-seqs"]) == ("2304", "6")
        for k in ("FLASHINFER_DISABLE_VERSION_CHECK", "NCCL_NET", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
                  "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "NCCL_IB_ADDR_RANGE", "NCCL_IB_GID_INDEX"):
            assert spec["env"][k] == CARD_ENV[k], k
        assert spec["memory"] == 118 * 2**30 and spec["shm_size"] == 32 * 2**30  # the card's --shm-size 32g
    assert rendered["dialect"] == "0.1.dev20051+g487ecf187"


def test_the_differences_themselves_are_what_the_docs_say(rendered: dict[str, Any]) -> None:
    got = {(k, r): (c, o) for k, r, c, o in differences(rendered)}
    assert got[("arg --port", 1)] == ("8000", "<absent>") and ("arg --port", 0) not in got  # the head's API only
    assert got[("arg --host", 0)] == ("0.0.0.0", "<absent>")
    assert ("docker --shm-size", 0) not in got  # rendered as the card: 32g beside --ipc host
    assert got[("docker --ulimit core", 0)] == ("<absent>", "0:0")
    assert got[("env NCCL_DEBUG", 0)] == ("WARN", "INFO")
    cache = got[("mount /cache", 0)][1]
    assert isinstance(cache, tuple) and cache[0].startswith("/home/ubuntu/.cache/sparkserve/") and not cache[1]
    assert got[("mount /models/drafter", 0)] == (None, (DRAFTER, True))  # once, read-only
    assert got[("mount /models/target", 0)] == (None, (TARGET, True))
    spec = json.loads(got[("arg --speculative-config", 0)][1])
    assert spec == {"method": "dflash", "model": "/models/drafter", "num_speculative_tokens": 7}



def test_the_default_drafter_is_the_launchers(tmp_path) -> None:
    """`init`'s drafter path is the launcher's DRAFTER_HOST_PATH default: -G, the Spark drafter of record."""
    from sparkserve.config import load_config

    assert str(load_config(None).drafter.path) == CARD_DRAFTER_DEFAULT


def test_the_800k_knobs_render_exactly(tmp_path) -> None:
    """`profile: long-800k` renders the launcher's 800K knobs to the byte, and nothing else of the launcher moves."""
    cfg = config_file(tmp_path / "sparkserve.yaml", {
        "profile": "long-800k",
        "nodes": [{"name": "spark-a", "host": "10.0.0.1", "fabric_ip": HOST_IP[0], "user": "ubuntu"},
                  {"name": "spark-b", "host": "10.0.0.2", "fabric_ip": HOST_IP[1], "user": "ubuntu"}],
        "fabric": {"interface": "enp1s0f1np1", "hca": "rocep1s0f1", "gid_index": 3, "master_port": 29521},
        "model": {"target": TARGET}, "drafter": {"path": DRAFTER},
    })
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_") or k == "SPARKSERVE_IMAGE_FACTS"}
    p = subprocess.run([sys.executable, "-m", "sparkserve", "render", "--json", "-c", str(cfg)], capture_output=True,
                       text=True, timeout=120, env={**env, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    diffs = {(k, r): (c, o) for k, r, c, o in differences(plan)}
    for flag, value in CARD_800K.items():
        assert diffs.pop((f"arg {flag}", 0)) == (card_args(0)[flag], value)
        assert diffs.pop((f"arg {flag}", 1)) == (card_args(1)[flag], value)
    assert {k for k, _r in diffs} <= set(EXPLAINED)
