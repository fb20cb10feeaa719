"""How `image build` reads the GPU smoke stage's outcome (sparkserve.image.build.gpu_stage): a failed
check is a GateFailed naming every failed check; docker's "no GPU" answer is a loud warning and an unmarked
image, never a pass; any other docker error is a failure. The program's output here is its real shape
(docker/tools/gpu_smoke.py), the container run replaced."""

from __future__ import annotations

import json

import pytest

from sparkserve.errors import GateFailed
from sparkserve.image import gpu_smoke as image_gpu
from sparkserve.image.build import gpu_stage
from sparkserve.nodes.base import NodeError


class _Node:
    name = "spark-a"


def _report(failed: list[str]) -> str:
    checks = [{"check": c, "ok": c not in failed, "detail": "boom" if c in failed else "fine", "seconds": 0.1}
              for c in ("device", "import vllm._C", "triton")]
    return json.dumps({"ok": not failed, "capability": "12.1", "checks": checks, "failed": failed,
                       "passed": [c["check"] for c in checks if c["ok"]], "not_covered": []})


def test_a_failed_check_fails_the_stage_naming_it(monkeypatch) -> None:
    monkeypatch.setattr(image_gpu, "run_in_image", lambda *a, **k: (1, _report(["triton"]), "gpu_smoke: triton"))
    lines: list[str] = []
    with pytest.raises(GateFailed) as e:
        gpu_stage(_Node(), "t:1", want_capability="12.1", say=lines.append)  # type: ignore[arg-type]
    assert e.value.line() == "error: spark-a: GPU smoke: t:1: triton: boom"
    assert "triton: boom" in e.value.details and "device: fine" in e.value.details


def test_no_gpu_is_a_loud_warning_and_no_mark(monkeypatch) -> None:
    def no_gpu(*a, **k):  # type: ignore[no-untyped-def]
        raise NodeError("spark-a", "gpu smoke", 't:1: could not select device driver "" with capabilities: [[gpu]]')

    monkeypatch.setattr(image_gpu, "run_in_image", no_gpu)
    marked: list[str] = []
    monkeypatch.setattr(image_gpu, "mark_gpu_verified", lambda *a: marked.append("x"))
    lines: list[str] = []
    gpu = gpu_stage(_Node(), "t:1", want_capability="12.1", say=lines.append)  # type: ignore[arg-type]
    assert not gpu.ran and not gpu.ok and gpu.why.startswith("no GPU on spark-a")
    assert any(ln.startswith("WARNING: no GPU on spark-a") and "t:1 is NOT GPU-verified" in ln for ln in lines)
    assert marked == []


def test_another_docker_error_is_a_failure_not_no_gpu(monkeypatch) -> None:
    def broken(*a, **k):  # type: ignore[no-untyped-def]
        raise NodeError("spark-a", "gpu smoke", "t:1: No such image: t:1")

    monkeypatch.setattr(image_gpu, "run_in_image", broken)
    with pytest.raises(NodeError, match="No such image"):
        gpu_stage(_Node(), "t:1", want_capability="12.1", say=lambda _s: None)  # type: ignore[arg-type]


def test_a_pass_is_marked(monkeypatch) -> None:
    monkeypatch.setattr(image_gpu, "run_in_image", lambda *a, **k: (0, _report([]), ""))
    marked: list[str] = []
    monkeypatch.setattr(image_gpu, "mark_gpu_verified", lambda node, tag, smoke: marked.append(tag))
    gpu = gpu_stage(_Node(), "t:1", want_capability="12.1", say=lambda _s: None)  # type: ignore[arg-type]
    assert gpu.ok and gpu.ran and marked == ["t:1"] and gpu.as_json()["passed"] == ["device", "import vllm._C",
                                                                                    "triton"]
