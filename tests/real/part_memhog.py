"""Free accelerator memory against GMU, on the real engine's machine (issue 26 item 1 / fault "GMU not compared"):
another process holds most GPU memory, and `sparkserve up` is refused by its pre-flight in seconds, with a headline
naming free memory against gpu_memory_utilization — not a boot that fails 83 s later with vLLM's own ValueError
quoted under an `EngineCore failed to start.` headline (measured on an H200 before this check existed).

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/memhog-dry \\
        --out /tmp/memhog-dry/out --parts memhog

After the scenario's boot and gates:

1. ``memhog-down``: `sparkserve down` (a stack already up would be "unchanged": no memory question asked);
2. ``memhog-hold``: a process from the carried site allocates all but ~6 GiB of the GPU's free memory with
   torch and holds it (dry run: no GPU — ``host.nvidia_smi`` points at a fake that reports 1 GiB free of an
   H200's 143771 MiB, the shape `nvidia-smi --query-gpu=memory.free,memory.total` prints);
3. ``memhog-up``: `sparkserve up` must exit 1 within 30 s, its one error line naming the node's free GPU memory
   against ``gpu_memory_utilization 0.3 x total``, and no rank may have started;
4. ``memhog-free``: the hog exits; on the GPU, nvidia-smi must show the memory back.

Device time: the down (~5 s), torch's import and CUDA init in the hog (~10 s), the refusal (~5 s): ~25 s. Run
it last among the parts: the stack stays down after it. Dry run (emulator, 2-core VM, 2026-12-01): every step
passed; `up` refused in 13.4 s (validation on the loaded VM is most of it) with `error: gpu: preflight memory:
free GPU memory 1.00 GiB is below gpu_memory_utilization 0.3 x 140.40 GiB = 42.12 GiB: vLLM would refuse to
start — …`, no rank started.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HOG = r"""
import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = 6 * 2**30
held = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda")
print(f"held {held.numel()} of {total}", flush=True)
sys.stdin.read()   # until the scenario closes our stdin
"""


class _Hog:
    def __init__(self, s: Any) -> None:
        self.s = s
        self.proc: subprocess.Popen[str] | None = None
        self.cfg = s.cfg

    def down(self) -> None:
        p, took = self.s.sparkserve("memhog-down", "down", "-c", str(self.s.cfg), timeout=120)
        self.s.say("memhog-down", f"rc={p.returncode} in {took:.1f}s", ok=p.returncode == 0)

    def hold(self) -> None:
        s = self.s
        if not s.real:  # no GPU: the free-memory source is faked, as nvidia-smi would print it on a held H200
            fake = s.work / "bin" / "nvidia-smi-held"
            fake.write_text("#!/bin/sh\necho '1024, 143771'\n")
            fake.chmod(0o755)
            import yaml

            data = yaml.safe_load(s.cfg.read_text())
            data.setdefault("host", {})["nvidia_smi"] = str(fake)
            self.cfg = s.work / "sparkserve-memhog.yaml"
            self.cfg.write_text(yaml.safe_dump(data, sort_keys=False))
            s.say("memhog-hold", f"dry run: host.nvidia_smi = {fake} (1024 MiB free of 143771)")
            return
        t = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=s.env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        smi = _smi()
        s.say("memhog-hold", f"{line or 'no line: ' + (self.proc.stderr.read() if self.proc.stderr else '')}; "
              f"nvidia-smi free/total MiB {smi} in {time.monotonic() - t:.1f}s", ok=line.startswith("held"),
              nvidia_smi=smi)

    def up_refused(self) -> None:
        s = self.s
        p, took = s.run("memhog-up", [sys.executable, "-m", "sparkserve", "up", "-c", str(self.cfg)], timeout=120)
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
        head = errors[0] if errors else ""
        ranks = len(s.manifests())  # runtime process: each started rank leaves its manifest under run/
        ok = (p.returncode == 1 and took < 30 and "preflight memory" in head and "free GPU memory" in head
              and "gpu_memory_utilization 0.3 x" in head and ranks == 0)
        s.say("memhog-up", f"rc={p.returncode} in {took:.1f}s, ranks left {ranks}: {head[:300]}", ok=ok,
              headline=head, seconds=round(took, 1))

    def free(self) -> None:
        s = self.s
        if self.proc is None:
            s.say("memhog-free", "dry run: nothing held")
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        smi = _smi()
        s.say("memhog-free", f"hog exited rc={self.proc.returncode}; nvidia-smi free/total MiB {smi}",
              ok=self.proc.returncode == 0, nvidia_smi=smi)


def _smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"n/a ({e})"


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    h = _Hog(s)
    return [("memhog-down", h.down, 30), ("memhog-hold", h.hold, 30), ("memhog-up", h.up_refused, 40),
            ("memhog-free", h.free, 20)]
