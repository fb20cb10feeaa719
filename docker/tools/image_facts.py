#!/usr/bin/env python3
"""Facts about the vLLM install in this image, as one JSON object on stdout (standard library only).

    python3 image_facts.py                      # finds site-packages with vllm/ on sys.path
    python3 image_facts.py --site DIR           # or reads the tree at DIR (a wheel unpacked anywhere)
    python3 image_facts.py --no-archs           # skip the .so census (seconds on a 20 GB image)

It never imports vllm or torch, so it runs on a machine without a GPU, CUDA or network. Facts:

* ``vllm``: ``__version__`` and ``__commit_id__`` from ``vllm/_version.py`` (``Version:`` of METADATA too).
* ``record``: every file listed in the wheel's ``*.dist-info/RECORD`` re-hashed; ``differing`` lists the
  files whose sha256 is not the wheel's (in a patched image: exactly the files the series touched),
  ``missing`` the listed files that are absent.
* ``archs``: the compiled CUDA code in each ``vllm/**/*.so``, read from its ``.nv_fatbin`` ELF section
  (fatbin magic 0xBA55ED50). See :func:`decode_entry` for how a variant is told apart.
* ``dflash2``: each ``*DFlash*`` architecture of ``vllm/model_executor/models/registry.py`` and whether its
  ``(module, class)`` is defined (read with ``ast``).
* ``registry``: the architectures the image's lock names in its registry checks (the card's gate:
  ``Glm5NextForConditionalGeneration``), each with its ``(module, class)`` and whether it is defined.
* ``overlays``: the sha256 of each file the lock names as an overlay (null: absent).
* ``packages``: the installed versions of flashinfer-python, flashinfer-cubin, flashinfer-jit-cache, torch,
  triton (``*.dist-info/METADATA``) and the CUDA version torch was built with (``torch/version.py``).
* ``gpu_smoke``: the GPU smoke stage's record (``/opt/sparkserve/gpu-smoke.json``): ``verified`` false until
  ``docker/tools/gpu_smoke.py`` passed on a GPU (a build without one says so), null for an image sparkserve
  did not build.
* ``--serve-dialect`` (alone): the engine's flag dialect — the image's own ``vllm serve`` parser dumped (option
  list + version) when vllm imports, else the version ``vllm --version`` prints (:func:`serve_dialect`).
* ``applied``: the series manifest the applier wrote (``/opt/sparkserve/applied.json``), or null;
  ``lock``: the recipe lock the image was built from (``/opt/sparkserve/lock.json``), or null.
"""

from __future__ import annotations

import argparse
import ast
import base64
import csv
import hashlib
import json
import os
import platform
import re
import struct
import sys
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_CUBIN = 1, 2
# Fatbin entry ``flags`` bits, measured on the vLLM 0.33.0 wheels (x86_64 and aarch64): FlashMLA's cubins,
# which vLLM builds only for 9.0a and 10.0a, carry 0x100000 at sm_90 and 0x200000 at sm_100; every
# sm >= 100 entry carries 0x1000000 (the CUDA 12.9+ ELF ABI); 0x8000 marks a zstd payload.
FLAG_NEW_ABI = 0x1000000
FLAG_ARCH_SPECIFIC_OLD = 0x100000
FLAG_ARCH_SPECIFIC_NEW = 0x200000
FLAG_COMPRESSED = 0x2000 | 0x8000
PTX_TARGET = re.compile(rb"\.target\s+(sm_\d+[af]?)")
APPLIED_MANIFEST = "/opt/sparkserve/applied.json"
IMAGE_LOCK = "/opt/sparkserve/lock.json"
GPU_SMOKE = "/opt/sparkserve/gpu-smoke.json"
PACKAGES = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "torch", "triton")
SM121 = 121


def find_site(explicit: str | None) -> Path | None:
    """``--site``, else the sys.path entry holding ``vllm/_version.py``; None when there is none (an image
    without vLLM: its facts say so instead of failing)."""
    if explicit:
        return Path(explicit)
    for p in sys.path:
        if p and (Path(p) / "vllm" / "_version.py").is_file():
            return Path(p)
    return None


def vllm_version(site: Path) -> dict[str, str | None]:
    text = (site / "vllm" / "_version.py").read_text()
    out: dict[str, str | None] = {"version": None, "commit": None, "metadata_version": None}
    for key, name in (("version", "__version__"), ("commit", "__commit_id__")):
        m = re.search(rf"^{name}\s*=.*?['\"]([^'\"]+)['\"]", text, re.M)
        out[key] = m.group(1) if m else None
    for meta in site.glob("vllm-*.dist-info/METADATA"):
        m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        out["metadata_version"] = m.group(1) if m else None
    return out


def record_diff(site: Path) -> dict[str, object]:
    """Files of vLLM's RECORD whose sha256 differs from the wheel's, and the listed files that are absent."""
    records = sorted(site.glob("vllm-*.dist-info/RECORD"))
    if not records:
        return {"record": None, "checked": 0, "differing": [], "missing": []}
    differing, missing, checked = [], [], 0
    with open(records[0], newline="") as f:
        rows = list(csv.reader(f))
    for parts in rows:
        if len(parts) != 3 or not parts[1].startswith("sha256="):
            continue  # RECORD itself and .pyc entries carry no hash
        rel, want = parts[0], parts[1].removeprefix("sha256=")
        path = site / rel
        if not path.is_file():
            missing.append(rel)
            continue
        checked += 1
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
        if got != want:
            differing.append(rel)
    return {"record": str(records[0].relative_to(site)), "checked": checked, "differing": differing,
            "missing": missing}


# ------------------------------------------------------------------------------------------------ fatbin


def elf_section(data: bytes, wanted: str) -> bytes | None:
    """The bytes of the named section of a 64-bit little-endian ELF, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not shoff or shstrndx >= shnum:
        return None
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    str_off = sections[shstrndx][4]
    for name_off, _type, _flags, _addr, off, size in sections:
        end = data.find(b"\0", str_off + name_off)
        if data[str_off + name_off:end].decode(errors="replace") == wanted:
            return data[off:off + size]
    return None


def decode_entry(kind: int, arch: int, flags: int, payload: bytes) -> str:
    """One fatbin entry as ``sm_121a`` / ``sm_120a`` / ``sm_120f`` / ``sm_120`` (cubins) or
    ``compute_120f`` … (PTX).

    The ``a`` (arch-specific) bit is read from the entry flags (measured, see FLAG_*). A family (``f``)
    target is named in PTX text (``.target sm_120f``) and is read from there when the payload is not
    compressed; a compressed cubin's family bit sits in its ELF header inside the zstd payload, which the
    standard library cannot open, so such a cubin reads as plain ``sm_120`` (plain and family cubins both
    run on every later SM of the same major; only ``a`` cubins do not)."""
    variant = ""
    if flags & (FLAG_ARCH_SPECIFIC_NEW if flags & FLAG_NEW_ABI else FLAG_ARCH_SPECIFIC_OLD):
        variant = "a"
    if not flags & FLAG_COMPRESSED:
        m = PTX_TARGET.search(payload[:4096])
        if m:
            named = m.group(1).decode()
            variant = named[-1] if named[-1] in "af" else variant
    prefix = "compute" if kind == KIND_PTX else "sm"
    return f"{prefix}_{arch}{variant}"


def fatbin_entries(section: bytes) -> list[str]:
    """Every entry of every fatbin container in a ``.nv_fatbin`` section, decoded."""
    out: list[str] = []
    off = 0
    while off + 16 <= len(section):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", section, off)
        if magic != FATBIN_MAGIC:
            off += 8  # containers are 8-byte aligned
            continue
        p, end = off + header_size, off + header_size + fat_size
        while p + 64 <= end:
            kind, _u, entry_size, payload_size = struct.unpack_from("<HHIQ", section, p)
            if entry_size < 64:
                break
            arch = struct.unpack_from("<I", section, p + 28)[0]
            flags = struct.unpack_from("<Q", section, p + 40)[0]
            if kind in (KIND_PTX, KIND_CUBIN):
                out.append(decode_entry(kind, arch, flags, section[p + entry_size:p + entry_size + 4096]))
            p += entry_size + payload_size
        off = max(end, off + 16)
    return out


def runs_on(code: str, sm: int = SM121) -> bool:
    """Whether one decoded entry runs on ``sm``: an ``a`` cubin only on its own SM; a plain or family
    cubin on its SM and later minors of the same major; PTX (not ``a``) JIT-compiles on any later SM."""
    kind, _, rest = code.partition("_")
    m = re.fullmatch(r"(\d+)([af]?)", rest)
    if not m:
        return False
    num, variant = int(m.group(1)), m.group(2)
    if variant == "a":
        return num == sm
    if kind == "compute":
        return num <= sm
    return num // 10 == sm // 10 and num <= sm


def arch_census(site: Path) -> dict[str, object]:
    libs: dict[str, dict[str, object]] = {}
    for so in sorted((site / "vllm").rglob("*.so")):
        section = elf_section(so.read_bytes(), ".nv_fatbin")
        if section is None:
            continue
        counts: dict[str, int] = {}
        for code in fatbin_entries(section):
            counts[code] = counts.get(code, 0) + 1
        if not counts:
            continue
        native = sorted(c for c in counts if c.startswith("sm_") and runs_on(c))
        jit = sorted(c for c in counts if c.startswith("compute_") and runs_on(c))
        libs[str(so.relative_to(site))] = {
            "codes": dict(sorted(counts.items())),
            "sm121": "native" if native else ("ptx-jit" if jit else "none"),
            "built_for_sm121a": "sm_121a" in counts,
        }
    return {
        "libraries": libs,
        "all_run_on_sm121": bool(libs) and all(v["sm121"] != "none" for v in libs.values()),
        "built_for_sm121a": sorted(k for k, v in libs.items() if v["built_for_sm121a"]),
        "without_sm121_code": sorted(k for k, v in libs.items() if v["sm121"] == "none"),
    }


# ----------------------------------------------------------------------------------------------- DFlash2


def dflash2_classes(site: Path) -> dict[str, dict[str, object]]:
    """Each ``*DFlash*`` registry architecture → its (module, class) and whether that class is defined."""
    return registry_classes(site, None)


def registry_classes(site: Path, names: set[str] | None) -> dict[str, dict[str, object]]:
    """Registry architectures (``names``, or every ``*DFlash*`` one for None) → (module, class) and whether
    that class is defined, read from ``vllm/model_executor/models/registry.py`` with ``ast`` (no import)."""
    models = site / "vllm" / "model_executor" / "models"
    registry = models / "registry.py"
    if not registry.is_file():
        return {}
    out: dict[str, dict[str, object]] = {}
    for node in ast.walk(ast.parse(registry.read_text())):
        if not isinstance(node, ast.Dict):
            continue
        for k, v in zip(node.keys, node.values, strict=True):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)
                    and (k.value in names if names is not None else "DFlash" in k.value)):
                continue
            if not (isinstance(v, ast.Tuple) and len(v.elts) == 2
                    and all(isinstance(e, ast.Constant) for e in v.elts)):
                continue
            module, cls = (e.value for e in v.elts)  # type: ignore[attr-defined]
            rel = Path(*module.split(".")) if module.startswith("vllm.") else models.relative_to(site) / module
            candidates = [site / rel.with_suffix(".py"), site / rel / "__init__.py"]
            defined = any(_defines(p, cls) for p in candidates)
            out[k.value] = {"module": module, "class": cls, "defined": defined}
    return dict(sorted(out.items()))


def _defines(path: Path, cls: str) -> bool:
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == cls for a in node.names):
            return True
    return False


def packages(site: Path) -> dict[str, str | None]:
    """Installed versions of the packages a serving image needs beside vLLM, and torch's CUDA version."""
    out: dict[str, str | None] = dict.fromkeys(PACKAGES)
    for meta in site.glob("*.dist-info/METADATA"):
        head = meta.read_text(errors="replace")[:4096]
        name = re.search(r"^Name:\s*(\S+)", head, re.M)
        version = re.search(r"^Version:\s*(\S+)", head, re.M)
        key = name.group(1).lower().replace("_", "-") if name else ""
        if key in out and version:
            out[key] = version.group(1)
    torch_version = site / "torch" / "version.py"
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", torch_version.read_text(), re.M) \
        if torch_version.is_file() else None
    out["torch_cuda"] = m.group(1) if m else None
    return out


def _json_file(path: str) -> object:
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def facts(site: Path | None, *, archs: bool = True, applied: str = APPLIED_MANIFEST) -> dict[str, object]:
    manifest = Path(applied)
    if site is None or not (site / "vllm" / "_version.py").is_file():
        return {"site": None, "python": platform.python_version(), "machine": platform.machine(),
                "vllm": {"version": None, "commit": None, "metadata_version": None}, "record": None,
                "archs": None, "dflash2": {}, "applied": None, "lock": None, "cuda_arch_env": {},
                "registry": {}, "overlays": {}, "packages": {}, "gpu_smoke": _json_file(GPU_SMOKE)}
    lock = _json_file(IMAGE_LOCK)
    lock = lock if isinstance(lock, dict) else None
    wanted = set(((lock or {}).get("checks") or {}).get("registry") or [])
    return {
        "site": str(site),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "vllm": vllm_version(site),
        "record": record_diff(site),
        "archs": arch_census(site) if archs else None,
        "dflash2": dflash2_classes(site),
        "applied": json.loads(manifest.read_text()) if manifest.is_file() else None,
        "lock": lock,
        "cuda_arch_env": {k: v for k, v in os.environ.items() if k.endswith("CUDA_ARCH_LIST")},
        "registry": registry_classes(site, wanted) if wanted else {},
        "overlays": {rel: _sha256(site / rel) for rel in ((lock or {}).get("overlays") or {})},
        "packages": packages(site),
        "gpu_smoke": _json_file(GPU_SMOKE),
    }


def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------ the engine's dialect


def _jsonable(v: object) -> object:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def _type_name(t: object) -> str | None:
    if t is None:
        return None
    name = getattr(t, "__name__", None)
    if name is None and hasattr(t, "func"):  # functools.partial
        name = getattr(t.func, "__name__", None)
    return name or repr(t)


def _parser_dump() -> dict[str, object]:
    """vLLM's own `vllm serve` parser in this interpreter, dumped in the shape of sparkserve's committed option
    lists (scripts/dump_vllm_serve_args.py). Imports vllm: its prints are sent to stderr meanwhile."""
    import contextlib

    # the parser is the same whatever the device; a node answering image facts runs no GPU container
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            import vllm
            from vllm.entrypoints.cli.serve import ServeSubcommand
            from vllm.utils.argparse_utils import FlexibleArgumentParser

            top = FlexibleArgumentParser(description="vLLM CLI")
            serve = ServeSubcommand().subparser_init(top.add_subparsers(required=False, dest="subparser"))
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    group_of = {id(a): g.title for g in serve._action_groups for a in g._group_actions}
    options = [{
        "option_strings": list(a.option_strings), "dest": a.dest, "group": group_of.get(id(a)),
        "action": type(a).__name__, "type": _type_name(a.type), "nargs": _jsonable(a.nargs),
        "metavar": _jsonable(a.metavar), "choices": _jsonable(list(a.choices)) if a.choices is not None else None,
        "default": _jsonable(a.default), "required": bool(a.required), "help": None,
    } for a in serve._actions if not isinstance(a, argparse._HelpAction)]
    return {"generator": "the image's own `vllm serve` parser (docker/tools/image_facts.py --serve-dialect)",
            "vllm_version": vllm.__version__, "num_actions": len(options),
            "num_option_strings": sum(len(o["option_strings"]) for o in options), "options": options}


def serve_dialect() -> dict[str, object]:
    """The engine's flag dialect as the image itself states it: its own parser's option list and version when
    vllm imports here, else the version its `vllm --version` prints (an engine that is not a Python vLLM
    install, or one whose parser cannot be built without a GPU); ``how`` says which, ``error`` why not more."""
    import shutil
    import subprocess

    try:
        dump = _parser_dump()
        return {"vllm_version": dump["vllm_version"], "options": dump, "how": "parser", "error": None}
    except Exception as e:  # noqa: BLE001 - any failure of a foreign import is a fact to report, not a crash
        why = f"{type(e).__name__}: {e}"
    exe = shutil.which("vllm")
    if exe is None:
        return {"vllm_version": None, "options": None, "how": None, "error": why + "; no vllm on PATH"}
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"vllm_version": None, "options": None, "how": None, "error": f"{why}; vllm --version: {e}"}
    lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
    version = lines[-1].split()[0] if p.returncode == 0 and lines else None  # "<version>[ (note)]"
    return {"vllm_version": version, "options": None, "how": "vllm --version", "error": why}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", help="site-packages directory holding vllm/ (default: found on sys.path)")
    ap.add_argument("--no-archs", action="store_true", help="skip the .nv_fatbin census")
    ap.add_argument("--applied", default=APPLIED_MANIFEST, help="the applier's manifest")
    ap.add_argument("--serve-dialect", action="store_true", help="print only the engine's flag dialect: its own "
                    "`vllm serve` option list and version (sparkserve's image verify keeps them)")
    args = ap.parse_args(argv)
    if args.serve_dialect:
        json.dump(serve_dialect(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    json.dump(facts(find_site(args.site), archs=not args.no_archs, applied=args.applied), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
