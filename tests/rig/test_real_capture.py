"""The emulator, booted with the configuration of the real vLLM 0.25.1 capture, logs the same events in the
same order, on the same node and rank, as the real A-head.log / A-follower.log (times, pids, durations aside).

The capture (../shared/data/real-vllm-0.25.1/README.md): TP=2 over two nodes (mp), a 4-layer Qwen3 target
(hidden 256, 4 heads / 2 KV heads, vocab 1024) and a 1-layer DFlashDraftModel drafter (mask_token_id 4,
target_layer_ids [0, 1, 2], block 8) with mask_embedding.pt, fp8 KV with 1 GiB, graphs FULL_AND_PIECEWISE.
Each node runs the argv from the first line of its log, unchanged but for the ports (free ones, so runs never
collide) and the word ``serve`` (the capture's command line omits it).

Allowed differences (0.25.1 on H200 → 0.33.0 on a Spark pair) are listed in ``logevents.ONLY_IN_025`` and
``ONLY_IN_033``; beyond those the per-role event sequences must be identical. Format-only changes (the 0.31+
prefix: unprefixed uvicorn/tqdm/main-process lines, ``Model loading took … GiB memory``, the KV size and
concurrency lines merged, ``[tag] `` before torch.compile lines) are absorbed by the event keys.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import docker.types
import logevents
import pytest
import runner
from formats_033 import check
from scenario import free_port

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "helpers"))
import tiny_models  # noqa: E402

pytestmark = pytest.mark.rig
CAPTURE = Path("/work/shared/data/real-vllm-0.25.1")


def capture_argv(log: Path) -> list[str]:
    """The first line of a capture log ("$ vllm …"), split like the shell did (JSON values kept whole)."""
    line = log.read_text().splitlines()[0]
    assert line.startswith("$ vllm ")
    out, buf, depth = [], [], 0
    for tok in line[2:].split(" "):
        if depth or tok.startswith("{"):
            buf.append(tok)
            depth += tok.count("{") - tok.count("}")
            if depth == 0:
                out.append(" ".join(buf))
                buf = []
            continue
        out.append(tok)
    if out[1] != "serve":
        out.insert(1, "serve")
    return out


def with_ports(argv: list[str], master_port: int, api_port: int) -> list[str]:
    out = list(argv)
    for flag, value in (("--master-port", master_port), ("--port", api_port)):
        if flag in out:
            out[out.index(flag) + 1] = str(value)
    return out


@pytest.fixture(scope="module")
def capture_models(rig) -> dict[str, str]:
    """The capture's model geometry, written on every node (node-local copies)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    for n in rig.nodes:
        base = Path(n.srv_dir) / "models" / "capture"
        t = tiny_models.write_target(base / "target", tiny_models.TargetSpec(vocab_size=1024))
        # the rest of a Qwen3 checkpoint (embeddings, lm_head, o_proj, MLP): 0.01 GiB, like the capture's target
        tensors = load_file(str(t / "model.safetensors"))
        tensors["model.embed_tokens.weight"] = np.zeros((1024, 256), dtype=np.float16)
        tensors["lm_head.weight"] = np.zeros((1024, 256), dtype=np.float16)
        for i in range(4):
            tensors[f"model.layers.{i}.self_attn.o_proj.weight"] = np.zeros((256, 256), dtype=np.float16)
            for proj, shape in (("gate_proj", (512, 256)), ("up_proj", (512, 256)), ("down_proj", (256, 512))):
                tensors[f"model.layers.{i}.mlp.{proj}.weight"] = np.zeros(shape, dtype=np.float16)
            tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = np.ones(256, dtype=np.float16)
        save_file(tensors, str(t / "model.safetensors"), metadata={"format": "pt"})
        d = tiny_models.write_drafter(base / "drafter", tiny_models.DrafterSpec(
            architecture="DFlashDraftModel", num_hidden_layers=1, mask_token_id=4, vocab_size=1024, block_size=8,
            target_layer_ids=[0, 1, 2]))
        cfg = json.loads((d / "config.json").read_text())
        cfg["max_position_embeddings"] = 8192  # the capture's drafter: "Using max model len 8192"
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return {"target": f"{rig.node_root}/models/capture/target", "drafter": f"{rig.node_root}/models/capture/drafter"}


def run_rank(client, rig, argv: list[str], name: str, models: dict[str, str]):
    mounts = [docker.types.Mount("/models/target", models["target"], type="bind", read_only=True),
              docker.types.Mount("/models/drafter", models["drafter"], type="bind", read_only=True)]
    return client.containers.run(
        rig.image_ref, argv, name=name, detach=True, network_mode="host", ipc_mode="host", mounts=mounts,
        environment={"VLLM_USE_FLASHINFER_SAMPLER": "0"},  # as in the capture (its FlashInfer line)
        labels={"io.sparkserve.managed": "1", "io.sparkserve.test": "real-capture"})


def test_emulator_boot_matches_the_real_capture(rig_clean, rig_docker, capture_models) -> None:
    rig = rig_clean
    master, api = free_port("127.0.0.1"), free_port("127.0.0.1")
    head_argv = with_ports(capture_argv(CAPTURE / "A-head.log"), master, api)
    foll_argv = with_ports(capture_argv(CAPTURE / "A-follower.log"), master, api)
    assert head_argv[-2:] == ["--port", str(api)] and foll_argv[-1] == "--headless"
    follower = run_rank(rig_docker["node-b"], rig, foll_argv, "capture-r1", capture_models)
    head = run_rank(rig_docker["node-a"], rig, head_argv, "capture-r0", capture_models)
    def alive() -> bool:
        return all(c.reload() or c.status == "running" for c in (follower, head))

    try:
        runner.wait_ready(f"http://127.0.0.1:{api}", timeout=60, alive=alive)
    except runner.RunnerError as e:
        tails = {name: c.logs(tail=30).decode(errors="replace") for name, c in (("head", head), ("follower", follower))}
        pytest.fail(f"{e}\n" + "\n".join(f"--- {k}:\n{v}" for k, v in tails.items()))
    time.sleep(0.5)
    logs = {}
    for node, c in (("head", head), ("follower", follower)):
        out = c.logs(stdout=True, stderr=False).decode()
        err = c.logs(stdout=False, stderr=True).decode()
        _, bad = check(out, err)
        assert not bad, f"{node}: lines no vLLM 0.33 format produces:\n" + "\n".join(bad[:10])
        logs[node] = out + err

    real_head = logevents.events((CAPTURE / "A-head.log").read_text(), until="Application startup complete.")
    real_foll = logevents.events((CAPTURE / "A-follower.log").read_text(), until="Kernel JIT monitor activated")
    emu_head = logevents.events(logs["head"], until="Application startup complete.")
    emu_foll = logevents.events(logs["follower"], until="Kernel JIT monitor activated")
    assert not [e for e in emu_head + emu_foll if e.key.startswith("?")], "unclassified emulator lines"

    diffs = {f"head {k}": v for k, v in logevents.compare(real_head, emu_head).items()}
    diffs |= {f"follower {k}": v for k, v in logevents.compare(real_foll, emu_foll).items()}
    assert not diffs, "\n".join(f"{role}:\n  real: {a}\n  emu:  {b}" for role, (a, b) in diffs.items())

    # same rank on the same node: the worker is TP0 on the head and TP1 on the follower, in both
    for evs, name in ((real_head, "Worker_TP0"), (emu_head, "Worker_TP0"), (real_foll, "Worker_TP1"),
                      (emu_foll, "Worker_TP1")):
        procs = {e.proc for e in evs if e.role == "Worker"}
        assert procs == {"Worker", name}, procs
        assert next(e for e in evs if e.key == "v2").proc == "Worker"  # before the rename, as in the capture
        assert next(e for e in evs if e.key == "mask").proc == name
    # and the numbers that do not depend on timing are the capture's
    kv = next(e.text for e in emu_head if e.key == "kv_size")
    assert "GPU KV cache size: 1,677,712 tokens" in kv and "4,096 tokens per request: 409.60x" in kv
    assert next(e.text for e in emu_head if e.key == "mask") == next(e.text for e in real_head if e.key == "mask")
    assert [e.text for e in emu_foll if e.key == "aux"] == [e.text for e in real_foll if e.key == "aux"]
    nondefault = next(e.text for e in emu_head if e.key == "nondefault")
    for part in ("'max_model_len': 4096", "'served_model_name': ['tiny']", "'nnodes': 2",
                 "'tensor_parallel_size': 2", "'kv_cache_memory_bytes': 1073741824", "'kv_cache_dtype': 'fp8_e4m3'",
                 "'max_num_seqs': 16", "'speculative_config': {'method': 'dflash', 'model': '/models/drafter', "
                 "'num_speculative_tokens': 7}", "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>"):
        assert part in nondefault, part
    assert re.search(r"'cudagraph_capture_sizes': \[1, 2, 4, 8, 16, 24, 32\]", nondefault)
