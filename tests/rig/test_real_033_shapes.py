"""The emulator's vLLM 0.33 lines held against the real vLLM 0.33.0 run (issue 43), line shape by line shape.

The real logs are tests/fixtures/logs/real-0.33.0-gpu/ (vLLM 0.33.0 on one H100, tiny random models; its README
says which device call wrote each). Two checks, each failing on a new difference:

1. every line of the real 0.33 boot logs (serving, replaced, killed, stopped) is produced by a format of the
   emulator's table (``formats_033``: vLLM's own format strings, proven against the wheel by
   test_formats_table.py), or is one of ``UNMODELLED``: real lines the emulator does not print, each named with
   why no reader of sparkserve needs it;
2. the emulator, booted on this host with the real run's own argv (the bare boot's ``$ vllm serve …`` line), prints
   every line sparkserve's readers use (``READ``: gates, ``logs analyze``, bench, supervise) that the real boot
   printed, from the same process, at the same level and the same ``[file:line]``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "helpers"))
sys.path.insert(0, str(HERE / "emulator"))

import formats_033 as F  # noqa: E402
import runner  # noqa: E402
import tiny_models  # noqa: E402
from scenario import free_port  # noqa: E402

pytestmark = pytest.mark.rig
REAL = HERE.parent / "fixtures" / "logs" / "real-0.33.0-gpu"
EMU = HERE / "emulator" / "vllm_emulator.py"

# Real 0.33.0 lines with no entry in the emulator's table, and why the emulator need not print them: no reader of
# sparkserve looks for them (observe/patterns_*.py has no needle for any), and none is a fault.
UNMODELLED: list[tuple[str, str]] = [
    (r"^W\d{4} [\d:.]+ \d+ torch/.*deprecated", "torch 2.14's own deprecation warnings (not vLLM's logger)"),
    (r"^\[W\d{4} [\d:.]+ Utils\.hpp:\d+\] Warning: Environment variable NCCL_BLOCKING_WAIT is deprecated",
     "PyTorch c10d warning: NCCL_BLOCKING_WAIT set in the device's environment"),
    (r"^Found ulimit of \d+ and failed to automatically increase", "host fd limit of the GPU machine (0.25.1 too)"),
    (r"^deep_gemm not found in site-packages|^DeepGEMM (?:PDL|E8M0) enabled", "Hopper DeepGEMM probing (H100)"),
    (r"^Initializing model took [\d.]+ seconds$", "model_executor/model_loader/base_loader.py timing"),
    (r"^Reducing Torch threads from \d+ to 1 for serving", "torch_utils: host core count"),
    (r"^Using LBNHC KV cache layout\.$", "attention backend KV layout (FlashAttention on the H100)"),
    (r"^collected artifacts: \d+ entries, \d+ artifacts, \d+ bytes total$", "torch.compile cache bookkeeping"),
    (r"^reconstructed serializable fn from standalone compile artifacts", "torch.compile cache load (warm boot)"),
    (r"^JIT kernel warmup (?:starting\.|finished in [\d.]+s\.)$", "kernel_warmup.py: JIT warmup"),
    (r"JIT kernel warmup \(\d+ compile keys\)", "the JIT warmup's tqdm bar"),
    (r"^cuteDSL \(CUTLASS Python\) not available", "cutlass-dsl is not carried to the GPU machine"),
    (r"^Scale-out endpoints are disabled\.", "entrypoints/scale_out/factories.py notice"),
    (r"^Triton kernel JIT compilation during inference: ", "jit_monitor.py WARNING: a kernel compiled while serving"),
    (r"resource_tracker|warnings\.warn\('resource_tracker", "Python's leaked-semaphore warning at exit"),
    (r"^\[rank0\]:W\d{4} [\d:.]+ \d+ torch/_inductor/triton_bundler\.py", "inductor cache warning (warm boot)"),
    (r"^ *[█▄▀ ]+(?:version \S+|model +\S+)?$|^$", "the logo's continuation lines written without vLLM's CR "
     "(sparkserve's saved copy ends lines with LF alone; the live log keeps `\\r\\n`)"),
]
_UNMODELLED = [re.compile(rx) for rx, _ in UNMODELLED]

# What sparkserve's readers take from a 0.33 boot log (observe/patterns_boot.py, gates, supervise's acceptance band).
READ = {"nondefault", "engine_cfg", "v2", "attn", "fa", "mask", "model_load", "kvdtype", "kv_reserved", "kv_size",
        "spec_capture", "graphs", "init_engine", "tasks", "starting", "jit", "logo"}


def _text(path: Path) -> str:
    text = path.read_bytes().decode("utf-8", "replace")
    return text.split("\n", 1)[1] if text.startswith("$ ") else text  # the probe/bare logs' argv line


def _unmatched(text: str) -> list[str]:
    """The records no format of the table produces (a vLLM record's message, else the raw line)."""
    out, prev = [], None
    for rec in F.records(text, "stdout"):
        if not F.classify(rec, prev):
            out.append(rec.text)
        prev = rec
    return out


def test_every_real_033_line_is_a_table_format_or_a_named_unmodelled_one() -> None:
    # the boots the emulator models: serving, swapped out, killed (kill -9 of the EngineCore) and stopped (SIGTERM);
    # the three failing probe boots (argparse/pydantic, CUDA OOM, KV sizing) are judged by their verdicts instead
    logs = sorted(REAL.glob("boot*.log"))
    assert len(logs) == 4, logs
    new = {}
    for log in logs:
        left = [t for t in _unmatched(_text(log)) if not any(rx.search(t) for rx in _UNMODELLED)]
        if left:
            new[log.name] = [t[:200] for t in left[:8]]
    assert not new, "real 0.33.0 lines no format of the emulator's table produces:\n" + json.dumps(new, indent=1)


def _shapes(text: str) -> dict[str, set[tuple[str, str, str]]]:
    out: dict[str, set[tuple[str, str, str]]] = {}
    recs, _ = F.check(text)
    for r in recs:
        if r.kind == "vllm" and r.fmt is not None:
            out.setdefault(r.fmt.key, set()).add((r.proc, r.extra["lvl"], r.extra["where"]))
    return out


def _real_argv(models: Path, port: int) -> list[str]:
    # the line as the run wrote it (" ".join of the argv; its JSON values hold no space)
    argv = (REAL / "boot-bare-sigterm.log").read_text().splitlines()[0][2:].split(" ")
    argv = [a.replace("/root/sparkserve-real/0.33.0/work/models", str(models)) for a in argv]
    assert argv[1] == "serve" and argv[-2] == "--port"
    return [sys.executable, str(EMU), *argv[1:-1], str(port)]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("real033")
    tiny_models.write_target(d / "target")
    tiny_models.write_drafter(d / "drafter", tiny_models.DrafterSpec(
        architecture="DFlashDraftModel", num_hidden_layers=1, mask_token_id=4))
    return d


def _emulate(models: Path, name: str, faults: str = "", then=None) -> str:
    """The emulator on the real run's argv until ready, then ``then(url)``; its stdout + stderr."""
    port = free_port("127.0.0.1")
    out, err = models / f"{name}.out", models / f"{name}.err"
    with out.open("w") as o, err.open("w") as e:
        p = subprocess.Popen(_real_argv(models, port), stdout=o, stderr=e,
                             env={**os.environ, "SSEMU_BOOT_SECONDS": "0.3", "SSEMU_FAULTS": faults})
        try:
            runner.wait_ready(f"http://127.0.0.1:{port}", timeout=60, alive=lambda: p.poll() is None)
            if then is not None:
                then(f"http://127.0.0.1:{port}")
                p.wait(30)  # a dead engine takes the API server down
        finally:
            if p.poll() is None:
                p.terminate()
                p.wait(30)
    return (out.read_bytes() + err.read_bytes()).decode()  # bytes: vLLM's `\r\n` continuations stay whole


@pytest.fixture(scope="module")
def emulated_boot(models: Path) -> str:
    return _emulate(models, "boot")


def test_the_emulator_prints_what_sparkserve_reads_as_the_real_033_boot_does(emulated_boot: str) -> None:
    real = _shapes(_text(REAL / "boot1-up.log"))
    emu = _shapes(emulated_boot)
    seen = READ & set(real)
    assert {"kv_size", "mask", "graphs", "v2", "init_engine", "starting"} <= seen, sorted(seen)
    diffs = {k: {"real": sorted(real[k]), "emulator": sorted(emu.get(k, set()))} for k in sorted(seen)
             if {(p, lvl, w) for p, lvl, w in emu.get(k, set())} != real[k]}
    assert not diffs, "lines sparkserve reads, shaped otherwise by the emulator:\n" + json.dumps(diffs, indent=1)


def _death(text: str) -> list[tuple[str, str, str, str]]:
    """The vLLM records from the first `[shutdown]` line on: (key, process, level, [file:line])."""
    recs, _ = F.check(text)
    rows = [(r.fmt.key if r.fmt else "?" + r.text[:60], r.proc, r.extra["lvl"], r.extra["where"])
            for r in recs if r.kind == "vllm" and (r.fmt is None or r.fmt.key not in ("stats", "spec"))]
    start = next(i for i, row in enumerate(rows) if row[0] in ("pm_sigterm", "mp_dead"))
    return rows[start:]


def test_a_killed_engine_core_logs_as_the_real_033_one_did(models: Path) -> None:
    import httpx

    def kill_mid_stream(url: str) -> None:
        body = {"model": "tiny", "stream": True, "max_tokens": 64,
                "messages": [{"role": "user", "content": "Tell a long story."}]}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
            lines = [ln for ln in r.iter_lines() if ln]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]"
        # the client's view, as the real run's kill-client.json: an error event with 0.33's client message
        assert json.loads(lines[-2][6:])["error"]["message"] == json.loads(
            (REAL / "kill-client.json").read_text())["error"][6:].split('"message":"')[1].split('"')[0]

    emu = _death(_emulate(models, "killed", "engine_kill@after=1", kill_mid_stream))
    real = _death(_text(REAL / "boot-killed.log"))
    assert [r[0] for r in real][:2] == ["pm_sigterm", "mp_dead"]
    assert emu == [(k, "APIServer", lvl, w) for k, _, lvl, w in real], json.dumps({"real": real, "emulator": emu},
                                                                                  indent=1)
