#!/usr/bin/env python3
"""What the vLLM being built requires, read from its own files, and its kernels' census (standard library).

    python3 wheel_pins.py requirement torch requirements/cuda.txt requirements/build.txt   # -> torch==2.14.0
    python3 wheel_pins.py flashinfer /wheels/vllm-*.whl     # -> flashinfer-python/-cubin/-jit-cache==<vLLM's pin>
    python3 wheel_pins.py pin /wheels/vllm-*.whl torch      # -> torch==<the wheel's Requires-Dist pin>
    python3 wheel_pins.py census /wheels/vllm-*.whl --sm 121 --keep-family 120   # SM12x code in _C, _moe_C

The source lane's Dockerfile runs these so that nothing it installs beside vLLM is a hand-written version:
torch comes from the CUDA 13.0 index at the version vLLM's requirements pin, FlashInfer (and its cubin and
jit-cache wheels) at exactly the ``flashinfer-python==`` of the built wheel's METADATA. A requirement that is
not an exact ``==`` pin is refused (exit 1, saying which), as is a census without SM12x code.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([A-Za-z0-9.+!_-]+)\s*(?:;.*)?$")


class Refusal(Exception):
    pass


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement(name: str, files: list[Path]) -> str:
    """``name==X`` from the first requirements file that pins it exactly (``-r`` includes followed)."""
    seen: set[Path] = set()
    queue = list(files)
    loose = None
    while queue:
        path = queue.pop(0)
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for raw in path.read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if line.startswith("-r "):
                queue.append(path.parent / line[3:].strip())
                continue
            m = REQ.match(line)
            if m and _norm(m.group(1)) == _norm(name):
                return f"{name}=={m.group(2)}"
            if re.match(rf"^{re.escape(name)}\b", line, re.I):
                loose = line
    found = f" (found {loose!r})" if loose else ""
    raise Refusal(f"{name}: no exact '==' pin in {', '.join(map(str, files))}{found}")


def metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise Refusal(f"{wheel.name}: no *.dist-info/METADATA")
        return z.read(name).decode(errors="replace")


def pin(wheel: Path, name: str) -> str:
    """``name==X`` from the wheel's ``Requires-Dist`` (an unconditional, exact pin)."""
    for line in metadata(wheel).splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        m = REQ.match(line.split(":", 1)[1])
        if m and _norm(m.group(1)) == _norm(name) and "extra ==" not in line:
            return f"{name}=={m.group(2)}"
    raise Refusal(f"{wheel.name}: no exact Requires-Dist pin for {name}")


def flashinfer(wheel: Path) -> list[str]:
    """The three FlashInfer wheels at the exact version the vLLM wheel requires."""
    version = pin(wheel, "flashinfer-python").split("==", 1)[1]
    return [f"flashinfer-python=={version}", f"flashinfer-cubin=={version}", f"flashinfer-jit-cache=={version}"]


def census(wheel: Path, sm: int, keep: int | None = None) -> list[str]:
    """Each ``_C`` / ``_moe_C`` library of the wheel with its SM``sm//10``x code; Refusal when one has none
    that runs on ``sm``, or (``keep``, e.g. 120) no plain/family cubin of that SM: a ``12.1a``-only arch list
    drops every ``12.0f``-gated kernel (vLLM's cmake keeps ``x.0f`` only when ``x.0`` is a target)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import image_facts

    out = []
    with zipfile.ZipFile(wheel) as z:
        for stem in ("_C", "_moe_C"):
            libs = [n for n in z.namelist() if re.fullmatch(rf"vllm/{stem}(_stable_libtorch)?\..*so", n)]
            if not libs:
                raise Refusal(f"{wheel.name}: no vllm/{stem}*.so")
            for lib in libs:
                codes = sorted(set(image_facts.fatbin_entries(image_facts.elf_section(z.read(lib), ".nv_fatbin")
                                                              or b"")))
                family = [c for c in codes if re.fullmatch(rf"sm_{sm // 10}\d[af]?", c)]
                runs = [c for c in codes if image_facts.runs_on(c, sm)]
                has = ", ".join(codes) or "none"
                if not family or not runs:
                    raise Refusal(f"{lib}: no SM{sm // 10}x code that runs on sm_{sm} (it has {has})")
                if keep is not None and not any(re.fullmatch(rf"sm_{keep}f?", c) for c in codes):
                    raise Refusal(f"{lib}: no sm_{keep}/sm_{keep}f family cubin (the {keep // 10}.{keep % 10}f "
                                  f"kernels were dropped: put {keep // 10}.{keep % 10} in the arch list; it has {has})")
                out.append(f"{lib}: {', '.join(family)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requirement")
    r.add_argument("name")
    r.add_argument("files", nargs="+", type=Path)
    f = sub.add_parser("flashinfer")
    f.add_argument("wheel", type=Path)
    p = sub.add_parser("pin")
    p.add_argument("wheel", type=Path)
    p.add_argument("name")
    c = sub.add_parser("census")
    c.add_argument("wheel", type=Path)
    c.add_argument("--sm", type=int, default=121)
    c.add_argument("--keep-family", type=int, help="also require a plain/family cubin of this SM (e.g. 120)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "requirement":
            print(requirement(args.name, args.files))
        elif args.cmd == "flashinfer":
            print("\n".join(flashinfer(args.wheel)))
        elif args.cmd == "pin":
            print(pin(args.wheel, args.name))
        else:
            for line in census(args.wheel, args.sm, args.keep_family):
                print(f"==> census: {line}", file=sys.stderr)
    except (Refusal, OSError, zipfile.BadZipFile) as e:
        print(f"wheel_pins: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
