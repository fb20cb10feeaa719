"""docker/tools/gpu_smoke.py run for real on this machine (no GPU): what needs a device fails, or is "not
covered" where --absent-ok allows it; the census reads real fatbins of a stand-in vLLM package; the image's
GPU mark as `image verify` shows it; docker's no-GPU answer is told apart from a failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from image_fixtures import NEW_A, NEW_ABI, PLAIN, TOOLS, elf_with_fatbin  # noqa: E402

PROGRAM = TOOLS / "gpu_smoke.py"


def _run(*args: str, pythonpath: Path | None = None) -> tuple[int, dict, str]:
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    res = subprocess.run([sys.executable, str(PROGRAM), *args], capture_output=True, text=True, timeout=120, env=env)
    return res.returncode, json.loads(res.stdout), res.stderr


def _fake_vllm(root: Path, entries: list) -> Path:
    """A vllm package whose _C and _moe_C carry ``entries`` in their .nv_fatbin (nothing importable)."""
    pkg = root / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for lib in ("_C.abi3.so", "_moe_C.abi3.so"):
        (pkg / lib).write_bytes(elf_with_fatbin(entries))
    return root


def test_without_a_gpu_every_device_check_fails_and_says_why(tmp_path: Path) -> None:
    rc, report, err = _run(pythonpath=_fake_vllm(tmp_path, [(2, 120, PLAIN | NEW_ABI, b"\0" * 8)]))
    assert rc == 1 and not report["ok"] and report["want_capability"] == "12.1"
    checks = {c["check"]: c for c in report["checks"]}
    assert list(checks) == ["device", "import vllm._C", "import vllm._moe_C", "import flashinfer", "nvcc",
                            "flashinfer-jit", "triton", "census"]
    assert checks["device"]["ok"] is False and checks["device"]["detail"].startswith("missing: ")
    assert "device" in report["failed"] and "triton" in report["failed"]
    assert checks["census"]["ok"] is True  # files only: sm_120 (family) runs on sm_121
    assert "_C.abi3.so: sm_120" in checks["census"]["detail"]
    assert "gpu_smoke: device: FAILED: missing:" in err


def test_absent_ok_turns_a_missing_prerequisite_into_not_covered(tmp_path: Path) -> None:
    rc, report, err = _run("--want-capability", "auto", "--absent-ok", "torch")
    assert rc == 0 and report["ok"] and report["failed"] == []
    assert "device" in report["not_covered"] and "census" in report["not_covered"]  # auto: no device, no SM
    assert "gpu_smoke: device: not covered: " in err


def test_the_census_fails_code_that_cannot_run_on_the_wanted_sm(tmp_path: Path) -> None:
    a121 = (2, 121, PLAIN | NEW_ABI | NEW_A, b"\0" * 8)
    only_hopper = _fake_vllm(tmp_path / "h", [(2, 90, PLAIN, b"\0" * 8)])
    rc, report, _ = _run("--absent-ok", "torch,nvcc,flashinfer,triton", pythonpath=only_hopper)
    census = next(c for c in report["checks"] if c["check"] == "census")
    assert rc == 1 and census["ok"] is False and "has no code for sm_121 (it has sm_90)" in census["detail"]
    rc, report, _ = _run("--absent-ok", "torch,nvcc,flashinfer,triton", pythonpath=_fake_vllm(tmp_path / "s",
                                                                                                [a121]))
    assert rc == 0 and "census" in report["passed"]
    rc, report, _ = _run("--want-capability", "12.0", "--absent-ok", "torch,nvcc,flashinfer,triton",
                         pythonpath=_fake_vllm(tmp_path / "t", [a121]))
    assert rc == 1 and "census" in report["failed"]  # an sm_121a cubin does not run on sm_120


def test_usage_errors_are_exit_2() -> None:
    res = subprocess.run([sys.executable, str(PROGRAM), "--want-capability", "twelve"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "is not major.minor or auto" in res.stderr


def test_the_gpu_mark_as_image_verify_shows_it() -> None:
    from sparkserve.image.gpu_smoke import NO_GPU, verification_line

    assert verification_line({"gpu_smoke": None}).startswith("GPU-verified: unknown")
    line = verification_line({"gpu_smoke": {"verified": False, "why": "built without running the GPU smoke "
                                            "stage on a GPU"}})
    assert line == "NOT GPU-verified: built without running the GPU smoke stage on a GPU"
    ok = verification_line({"gpu_smoke": {"verified": True, "node": "spark-a", "at": "2026-12-01T23:00:00Z",
                                          "capability": "12.1", "not_covered": []}})
    assert ok == "GPU-verified on spark-a at 2026-12-01T23:00:00Z (capability 12.1; not covered: none)"
    # docker 20.10-28 without the NVIDIA container toolkit, and with it but no device
    assert NO_GPU.search('could not select device driver "" with capabilities: [[gpu]]')
    assert NO_GPU.search("nvidia-container-cli: initialization error: nvml error: driver not loaded")
    assert not NO_GPU.search("No such image: sparkserve-rigtest/x:1")
