#!/usr/bin/env python3
"""The GPU smoke checks of a serving image: do its kernels load, build and run on this device?

    python3 gpu_smoke.py                                  # in the image, on the build node: docker run --gpus all
    python3 gpu_smoke.py --want-capability auto --absent-ok flashinfer,nvcc   # directly on a GPU machine

Standard library plus what the image has (torch, triton, flashinfer, vLLM). One JSON object on stdout; exit 0
when every check that ran passed and none was skipped without leave, 1 otherwise. The checks, in order:

* ``device``: a CUDA device, its name and compute capability; ``--want-capability 12.1`` (the default: a
  DGX Spark's GB10) fails any other, ``auto`` takes the device's own;
* ``import vllm._C`` / ``import vllm._moe_C`` / ``import flashinfer``: the compiled extensions load on it;
* ``nvcc``: on PATH or under ``$CUDA_HOME/bin`` (FlashInfer, TileLang and DeepGEMM compile at run time), with
  its release line;
* ``flashinfer-jit``: one FlashInfer kernel (RMSNorm) built in a fresh workspace and run, checked against
  torch (the detail says whether it compiled here or came precompiled from flashinfer-jit-cache/cubin);
* ``triton``: one Triton kernel compiled in a fresh cache and run, checked against torch (Triton >= 3.6
  carries its own ptxas for sm_121a);
* ``census``: the ``.nv_fatbin`` of vLLM's ``_C`` and ``_moe_C`` libraries (image_facts.py's reader) holds
  code that runs on the wanted SM (``--want-capability``, else the device's; for SM12x: the 12.0f family or
  12.1a kernels). It reads files only, so it runs without a device too.

A check whose prerequisite is missing (no torch, no flashinfer, no nvcc) fails, unless ``--absent-ok`` names
it: then it is "not covered" (``ok: null``) and the report says so. Nothing here needs a network.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKS = ("device", "import vllm._C", "import vllm._moe_C", "import flashinfer", "nvcc", "flashinfer-jit",
          "triton", "census")
#: --absent-ok groups: a name here covers every check that needs that piece
GROUPS = {"flashinfer": ("import flashinfer", "flashinfer-jit"), "nvcc": ("nvcc",), "vllm": (
    "import vllm._C", "import vllm._moe_C", "census"), "triton": ("triton",), "torch": CHECKS}


class Absent(Exception):
    """A prerequisite of the check is not installed here (not a failure of what is)."""


class Smoke:
    def __init__(self, want: str, absent_ok: set[str], scratch: Path) -> None:
        self.want = want
        self.absent_ok = {c for name in absent_ok for c in GROUPS.get(name, (name,))}
        self.results: list[dict[str, Any]] = []
        self.capability: tuple[int, int] | None = None
        # fresh JIT caches, set before anything imports flashinfer or triton (both read them at import):
        # a kernel found in them was built by this run
        self.fi_ws, self.triton_cache = scratch / "flashinfer", scratch / "triton"
        os.environ["FLASHINFER_WORKSPACE_BASE"] = str(self.fi_ws)
        os.environ["TRITON_CACHE_DIR"] = str(self.triton_cache)

    def check(self, name: str, fn: Callable[[], str]) -> None:
        t = time.monotonic()
        try:
            detail, ok = fn(), True
        except Absent as e:
            ok = None if name in self.absent_ok else False
            detail = f"missing: {e}" if ok is False else str(e)
        except Exception as e:  # noqa: BLE001 (any failure of the kernel or import is the finding)
            detail, ok = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}", False
        self.results.append({"check": name, "ok": ok, "detail": detail[:400],
                             "seconds": round(time.monotonic() - t, 2)})

    # -- the checks ---------------------------------------------------------------------------------------

    def torch(self) -> Any:
        try:
            import torch
        except ImportError as e:
            raise Absent(f"no torch ({e})") from None
        if not torch.cuda.is_available():
            raise Absent("torch sees no CUDA device")
        return torch

    def device(self) -> str:
        torch = self.torch()
        self.capability = tuple(torch.cuda.get_device_capability(0))  # type: ignore[assignment]
        got = f"{self.capability[0]}.{self.capability[1]}"
        name = torch.cuda.get_device_name(0)
        if self.want != "auto" and got != self.want:
            raise RuntimeError(f"{name} is compute capability {got}, this image is for {self.want}")
        return f"{name}, compute capability {got}, torch {torch.__version__} (CUDA {torch.version.cuda})"

    def imports(self, module: str) -> Callable[[], str]:
        """``import module`` (vLLM >= 0.33 names its extensions ``_C_stable_libtorch`` / ``_moe_C_stable_libtorch``:
        the first of the two names that exists is imported)."""
        def run() -> str:
            self.torch()
            top = module.split(".")[0]
            if importlib.util.find_spec(top) is None:
                raise Absent(f"no {top} installed")
            names = [module] + ([f"{module}_stable_libtorch"] if top == "vllm" else [])
            name = next((n for n in names if importlib.util.find_spec(n) is not None), module)
            mod = importlib.import_module(name)
            version = getattr(sys.modules[top], "__version__", "?")
            return f"{name} from {getattr(mod, '__file__', '?')} ({top} {version})"
        return run

    def nvcc(self) -> str:
        cands = [shutil.which("nvcc")] + [str(Path(d) / "bin" / "nvcc") for d in (
            os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if d]
        found = next((c for c in cands if c and Path(c).is_file()), None)
        if found is None:
            raise Absent("no nvcc on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin")
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60).stdout
        release = next((ln.strip() for ln in out.splitlines() if "release" in ln), out.strip()[-80:])
        return f"{found}: {release}"

    def flashinfer_jit(self) -> str:
        torch = self.torch()
        if importlib.util.find_spec("flashinfer") is None:
            raise Absent("no flashinfer installed")
        import flashinfer

        x = torch.randn(4, 256, dtype=torch.float16, device="cuda")
        w = torch.randn(256, dtype=torch.float16, device="cuda")
        got = flashinfer.norm.rmsnorm(x, w, eps=1e-6)
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half()
        err = (got.float() - ref.float()).abs().max().item()
        built = list(self.fi_ws.rglob("*.so"))
        if err > 2e-2:
            raise RuntimeError(f"flashinfer rmsnorm differs from torch by {err:.3g}")
        how = f"compiled here ({len(built)} .so in a fresh workspace)" if built else \
            "precompiled (flashinfer-jit-cache / cubin), loaded and run"
        return f"rmsnorm {how}; max |err| {err:.2g} (flashinfer {flashinfer.__version__})"

    def triton(self) -> str:
        torch = self.torch()
        try:
            import triton
            import triton.language as tl
        except ImportError as e:
            raise Absent(f"no triton ({e})") from None

        @triton.jit
        def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: N803 (triton's constexpr style)
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

        n = 4099
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = torch.empty_like(x)
        add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        torch.cuda.synchronize()
        compiled = len(list(self.triton_cache.rglob("*.cubin")))
        if not torch.equal(out, x + y):
            raise RuntimeError("the Triton add kernel's result differs from torch's")
        return f"add kernel compiled ({compiled} cubin) and run, exact (triton {triton.__version__})"

    def census(self) -> str:
        sys.path.insert(0, str(HERE))
        import image_facts

        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise Absent("no vllm installed")
        vdir = Path(next(iter(spec.submodule_search_locations)))
        if self.want != "auto":
            major, minor = (int(x) for x in self.want.split("."))
        elif self.capability is not None:
            major, minor = self.capability
        else:
            raise Absent("no device capability to census for (the device check did not pass)")
        sm = major * 10 + minor
        out = []
        for stem in ("_C", "_moe_C"):
            libs = sorted(p for p in vdir.glob(f"{stem}*.so")
                          if p.name.split(".")[0] in (stem, f"{stem}_stable_libtorch"))
            if not libs:
                raise RuntimeError(f"vllm/{stem}*.so not found in {vdir}")
            for lib in libs:
                section = image_facts.elf_section(lib.read_bytes(), ".nv_fatbin")
                codes = sorted(set(image_facts.fatbin_entries(section or b"")))
                native = [c for c in codes if c.startswith("sm_") and image_facts.runs_on(c, sm)]
                ptx = [c for c in codes if c.startswith("compute_") and image_facts.runs_on(c, sm)]
                if not native and not ptx:
                    raise RuntimeError(f"{lib.name} has no code for sm_{sm} (it has {', '.join(codes) or 'none'})")
                out.append(f"{lib.name}: {', '.join(native) or 'PTX only: ' + ', '.join(ptx)}")
        return f"sm_{sm}: " + "; ".join(out)

    def run(self) -> dict[str, Any]:
        self.check("device", self.device)
        for module in ("vllm._C", "vllm._moe_C", "flashinfer"):
            self.check(f"import {module}", self.imports(module))
        self.check("nvcc", self.nvcc)
        self.check("flashinfer-jit", self.flashinfer_jit)
        self.check("triton", self.triton)
        self.check("census", self.census)
        failed = [r["check"] for r in self.results if r["ok"] is False]
        return {"ok": not failed, "want_capability": self.want, "machine": platform.machine(),
                "python": platform.python_version(),
                "capability": ".".join(map(str, self.capability)) if self.capability else None,
                "checks": self.results, "passed": [r["check"] for r in self.results if r["ok"]],
                "not_covered": [r["check"] for r in self.results if r["ok"] is None], "failed": failed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--want-capability", default="12.1", help="major.minor the device must be, or auto")
    ap.add_argument("--absent-ok", default="", help="comma-separated: flashinfer, nvcc, vllm, triton, torch or a "
                    "check's name; a missing prerequisite there is 'not covered', not a failure")
    args = ap.parse_args(argv)
    if args.want_capability != "auto" and not all(p.isdigit() for p in args.want_capability.split(".")):
        ap.error(f"--want-capability {args.want_capability!r} is not major.minor or auto")
    absent_ok = {x.strip() for x in args.absent_ok.split(",") if x.strip()}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as scratch:
        report = Smoke(args.want_capability, absent_ok, Path(scratch)).run()
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")
    for r in report["checks"]:
        mark = {True: "ok", None: "not covered", False: "FAILED"}[r["ok"]]
        print(f"gpu_smoke: {r['check']}: {mark}: {r['detail']}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
