"""The image's GPU smoke checks (docker/tools/gpu_smoke.py, issue 23) run directly on the GPU machine.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/gpusmoke-dry \\
        --out /tmp/gpusmoke-dry/out --parts gpusmoke

The device has no docker, so the step runs the very program the build node runs inside the image
(`docker run --gpus all … gpu_smoke.py`), here with the device's python and the carried vLLM 0.25.1 site on
PYTHONPATH. What the device cannot show is recorded as "not covered", never as passed:

* the capability is the device's own (``--want-capability auto``: an H200 is 9.0, a Spark 12.1);
* the carried site has no FlashInfer and the device may have no nvcc (``--absent-ok flashinfer,nvcc``);
* the census is of vLLM 0.25.1's x86_64 wheel for the device's SM, not an SM12x build.

With ``--engine emulator`` (no GPU, no vLLM site) every check that needs a device is "not covered" and the
step passes when the program ran and said so; with ``--engine real`` a check that ran and failed fails it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "docker" / "tools" / "gpu_smoke.py"


def _smoke(s: Any) -> None:
    absent_ok = "flashinfer,nvcc" if s.real else "torch,vllm,flashinfer,nvcc,triton"
    p, took = s.run("gpu-smoke", [sys.executable, str(PROGRAM), "--want-capability", "auto", "--absent-ok",
                                  absent_ok], timeout=120)
    try:
        report = json.loads(p.stdout)
    except ValueError:
        s.say("gpu-smoke", f"the program printed no report (rc {p.returncode}): {p.stderr.strip()[-300:]}", ok=False)
        return
    (s.results / "gpu-smoke.json").write_text(json.dumps(report, indent=1) + "\n")
    details = {r["check"]: r["detail"] for r in report["checks"]}
    def names(key: str) -> str:
        return ", ".join(report[key]) or "none"

    figure = (f"capability {report['capability'] or '?'}; passed {names('passed')}; not covered "
              f"{names('not_covered')}; failed {names('failed')} ({took:.1f}s)")
    ok = p.returncode == 0 and report["ok"]
    if s.real:  # on the GPU the device, the vLLM extensions, Triton and the census must have run
        ok = ok and {"device", "import vllm._C", "import vllm._moe_C", "triton", "census"} <= set(report["passed"])
    s.say("gpu-smoke", figure, ok=ok, checks=details, passed=report["passed"], not_covered=report["not_covered"],
          failed=report["failed"])


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    return [("gpu-smoke", lambda: _smoke(s), 90)]
