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
* ``requires`` (also alone: ``--requires``, and inside ``--serve-dialect``'s answer): the installed ``vllm``
  distribution's ``Requires-Dist`` checked against what this interpreter can import (:func:`requires`) —
  the distributions that are missing, and those installed at a version outside the specifier.
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
from collections.abc import Callable
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


# ------------------------------------------------------------------------- vLLM's declared dependencies

#: a PEP 508 requirement, the fallback's reading when ``packaging`` is not importable in this environment
_REQ = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[(?P<extras>[^\]]*)\])?\s*"
                  r"(?:@\s*(?P<url>[^;\s]+)|\(?(?P<spec>[^;()]*)\)?)?\s*(?:;\s*(?P<marker>.*))?$")
_MARKER_TOKEN = re.compile(r"\s*(\(|\)|'[^']*'|\"[^\"]*\"|===|==|!=|~=|<=|>=|<|>|not\s+in\b|in\b|and\b|or\b|"
                           r"[A-Za-z_][A-Za-z0-9_.]*)")
_VERSION_VARS = {"python_version", "python_full_version", "implementation_version", "platform_release"}


def _norm(name: str) -> str:
    """PEP 503's normal form of a distribution name (``Nvidia_Cutlass.DSL`` → ``nvidia-cutlass-dsl``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _release(v: str) -> tuple[int, ...] | None:
    """The release numbers of a version (``2.14.0+cu130`` → (2, 14, 0); ``0.6.18.dev3`` → (0, 6, 18));
    None when it has none. The fallback compares only these (pre, post, dev and local parts are ignored)."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", v)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def _spec_holds(version: str, op: str, want: str) -> bool | None:
    """One PEP 440 clause by release numbers alone (the fallback); None when it cannot tell."""
    if op == "===":
        return version == want
    if want.endswith(".*") and op in ("==", "!="):
        got, prefix = _release(version), _release(want[:-2])
        if got is None or prefix is None:
            return None
        same = got[:len(prefix)] + (0,) * max(0, len(prefix) - len(got)) == prefix
        return same if op == "==" else not same
    got, ref = _release(version), _release(want)
    if got is None or ref is None:
        return None
    c = _cmp(got, ref)
    if op == "~=":
        return c >= 0 and got[:max(1, len(ref) - 1)] == ref[:max(1, len(ref) - 1)]
    return {"==": c == 0, "!=": c != 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}.get(op)


def _specifier_holds(version: str, spec: str) -> bool | None:
    """Whether ``version`` is inside ``spec`` (``>=1.0,!=1.2.*``): packaging's answer when it imports,
    else :func:`_spec_holds` per clause; None when it cannot tell."""
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:  # no packaging in this environment: the fallback below
        SpecifierSet = Version = None  # noqa: N806
    if SpecifierSet is not None and Version is not None:
        try:
            return SpecifierSet(spec).contains(Version(version), prereleases=True)
        except Exception:  # noqa: BLE001 - a version packaging cannot read (a fork's string): not a verdict
            return None
    verdicts = []
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        m = re.match(r"^(===|==|!=|~=|<=|>=|<|>)\s*(\S+)$", clause)
        verdicts.append(_spec_holds(version, m.group(1), m.group(2)) if m else None)
    if False in verdicts:
        return False
    return None if None in verdicts else True


def _marker_fallback(marker: str, env: dict[str, str]) -> bool:
    """A PEP 508 environment marker evaluated without ``packaging``: ``and``/``or``/parentheses over
    ``<var> <op> <value>`` comparisons; version variables compare by release numbers, the rest as strings.
    ValueError on anything else (the caller then counts the requirement as applying)."""
    tokens = _MARKER_TOKEN.findall(marker)
    if "".join(tokens).replace(" ", "") != marker.replace(" ", ""):
        raise ValueError(f"cannot read the marker {marker!r}")
    pos = 0

    def value(tok: str) -> tuple[str, str | None]:
        if tok[:1] in "'\"":
            return tok[1:-1], None
        if tok not in env:
            raise ValueError(f"unknown marker variable {tok!r}")
        return env[tok], tok

    def compare() -> bool:
        nonlocal pos
        if tokens[pos] == "(":
            pos += 1
            out = disjunction()
            if tokens[pos] != ")":
                raise ValueError("unbalanced parentheses")
            pos += 1
            return out
        (left, lvar), op, (right, rvar) = value(tokens[pos]), re.sub(r"\s+", " ", tokens[pos + 1]), \
            value(tokens[pos + 2])
        pos += 3
        if op in ("in", "not in"):
            return (left in right) == (op == "in")
        if (lvar or rvar) in _VERSION_VARS or (lvar is None and rvar is None):
            held = _spec_holds(left, op, right)
            if held is not None:
                return held
        if op in ("==", "==="):
            return left == right
        if op == "!=":
            return left != right
        raise ValueError(f"cannot compare {left!r} {op} {right!r}")

    def chain(word: str, operand: Callable[[], bool]) -> bool:
        """``operand (word operand)*``: every operand read (no short cut), combined by ``and`` / ``or``."""
        nonlocal pos
        out = operand()
        while pos < len(tokens) and tokens[pos] == word:
            pos += 1
            nxt = operand()
            out = (out and nxt) if word == "and" else (out or nxt)
        return out

    def conjunction() -> bool:
        return chain("and", compare)

    def disjunction() -> bool:
        return chain("or", conjunction)

    try:
        out = disjunction()
    except IndexError:
        raise ValueError(f"cannot read the marker {marker!r}") from None
    if pos != len(tokens):
        raise ValueError(f"cannot read the marker {marker!r}")
    return out


def marker_env() -> dict[str, str]:
    """PEP 508's environment of this interpreter (what ``packaging.markers.default_environment`` gives)."""
    impl = sys.implementation
    iv = impl.version
    impl_version = f"{iv.major}.{iv.minor}.{iv.micro}" + (f"{iv.releaselevel[0]}{iv.serial}"
                                                          if iv.releaselevel != "final" else "")
    return {"implementation_name": impl.name, "implementation_version": impl_version,
            "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
            "platform_system": platform.system(), "platform_version": platform.version(),
            "python_full_version": platform.python_version(),
            "platform_python_implementation": platform.python_implementation(),
            "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}


def parse_requirement(line: str) -> dict[str, object]:
    """One ``Requires-Dist`` value → name (as written), extras, specifier, marker, url (packaging's reading
    when it imports, else :data:`_REQ`'s). ValueError when neither can read it."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        m = _REQ.match(line)
        if m is None:
            raise ValueError(f"cannot read the requirement {line!r}") from None
        extras = sorted(e.strip() for e in (m.group("extras") or "").split(",") if e.strip())
        spec = re.sub(r"\s+", "", m.group("spec") or "")
        return {"name": m.group("name"), "extras": extras, "specifier": spec, "url": m.group("url"),
                "marker": (m.group("marker") or "").strip() or None}
    try:
        r = Requirement(line)
    except Exception as e:  # noqa: BLE001 - packaging's InvalidRequirement
        raise ValueError(f"cannot read the requirement {line!r}: {e}") from None
    return {"name": r.name, "extras": sorted(r.extras), "specifier": str(r.specifier), "url": r.url,
            "marker": str(r.marker) if r.marker is not None else None}


def marker_applies(marker: str | None, env: dict[str, str], extra: str = "") -> bool:
    """Whether a requirement's marker holds here with ``extra`` (``""``: vLLM installed without extras, so
    every ``extra == "…"`` requirement is left out). ValueError when the marker cannot be evaluated."""
    if not marker:
        return True
    try:
        from packaging.markers import Marker
    except ImportError:
        return _marker_fallback(marker, {**env, "extra": extra})
    try:
        return bool(Marker(marker).evaluate({**env, "extra": extra}))
    except Exception as e:  # noqa: BLE001 - packaging's InvalidMarker / UndefinedComparison
        raise ValueError(f"cannot evaluate the marker {marker!r}: {e}") from None


def check_requirements(lines: list[str], installed: dict[str, str], env: dict[str, str],
                       extra_lines: dict[str, list[str]] | None = None) -> dict[str, object]:
    """``Requires-Dist`` lines against the installed distributions (normal name → version).

    A requirement whose marker does not hold here (another platform, an ``extra`` nobody asked for) is
    skipped. One that names extras (``nvidia-cutlass-dsl[cu13]``) requires the distribution itself and, one
    level down, what that distribution's own ``Requires-Dist`` adds for those extras (``extra_lines``: its
    lines, by normal name; only when it is installed; those requirements' own dependencies are not followed).
    Missing: not installed. Mismatched: installed at a version outside the specifier (forks are normal: a
    warning for the caller). Unknown: a line, marker or version that could not be read."""
    missing: list[dict[str, object]] = []
    mismatched: list[dict[str, object]] = []
    unknown: list[dict[str, object]] = []
    checked = skipped = 0

    def one(line: str, extra: str, via: str | None) -> None:
        nonlocal checked, skipped
        try:
            req = parse_requirement(line)
            if not marker_applies(req["marker"], env, extra):  # type: ignore[arg-type]
                skipped += 1
                return
            # under an extra, only what the extra adds: the distribution's own base requirements are its own
            if via is not None and not (req["marker"] and "extra" in str(req["marker"])):
                skipped += 1
                return
        except ValueError as e:
            unknown.append({"requirement": line, "why": str(e), "via": via})
            return
        checked += 1
        name = _norm(str(req["name"]))
        row = {"name": name, "requirement": line.split(";")[0].strip(), "via": via}
        version = installed.get(name)
        if version is None:
            missing.append(row)
            return
        spec = str(req["specifier"] or "")
        held = _specifier_holds(version, spec) if spec else True
        if held is False:
            mismatched.append({**row, "installed": version})
        elif held is None:
            unknown.append({**row, "installed": version, "why": f"cannot compare {version!r} with {spec!r}"})
        if req["extras"] and version is not None:
            for sub in (extra_lines or {}).get(name, []):
                for ex in req["extras"]:  # type: ignore[union-attr]
                    one(sub, str(ex), f"{name}[{ex}]")

    for line in lines:
        one(line, "", None)
    return {"checked": checked, "skipped": skipped, "missing": missing, "mismatched": mismatched,
            "unknown": unknown}


def requires(dist_name: str = "vllm") -> dict[str, object]:
    """The installed ``vllm`` distribution's ``Requires-Dist`` checked in this interpreter (what it imports:
    ``importlib.metadata`` over ``sys.path``). ``vllm`` null: no such distribution (nothing to check)."""
    import importlib.metadata as md

    try:
        import packaging

        how = f"packaging {getattr(packaging, '__version__', '?')}"
    except ImportError:
        how = "fallback (no packaging here: markers and versions read by image_facts.py)"
    base = {"dist": dist_name, "python": platform.python_version(), "how": how}
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return {**base, "vllm": None, "error": None, "checked": 0, "skipped": 0, "missing": [], "mismatched": [],
                "unknown": []}
    installed: dict[str, str] = {}
    metadata: dict[str, object] = {}
    for d in md.distributions():  # the first on sys.path wins, as it does for import
        name = d.metadata.get("Name")
        if name and _norm(name) not in installed:
            installed[_norm(name)] = d.version
            metadata[_norm(name)] = d
    lines = list(dist.requires or [])
    extra_lines: dict[str, list[str]] = {}
    for line in lines:
        m = _REQ.match(line)
        if m and m.group("extras") and _norm(m.group("name")) in metadata:
            extra_lines[_norm(m.group("name"))] = list(metadata[_norm(m.group("name"))].requires or [])  # type: ignore[attr-defined]
    where = getattr(dist, "_path", None)
    return {**base, "vllm": dist.version, "location": str(where) if where is not None else None, "error": None,
            **check_requirements(lines, installed, marker_env(), extra_lines)}


def facts(site: Path | None, *, archs: bool = True, applied: str = APPLIED_MANIFEST,
          deps: bool = False) -> dict[str, object]:
    """Every fact (module docstring). ``deps``: check vLLM's Requires-Dist in this interpreter (false for a
    ``--site`` tree, which is not the environment this interpreter imports from)."""
    manifest = Path(applied)
    if site is None or not (site / "vllm" / "_version.py").is_file():
        return {"requires": _requires_or_error() if deps else None,
                "site": None, "python": platform.python_version(), "machine": platform.machine(),
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
        "requires": _requires_or_error() if deps else None,
    }


def _requires_or_error() -> dict[str, object]:
    try:
        return requires()
    except Exception as e:  # noqa: BLE001 - a broken metadata tree is a fact to report, not a crash
        return {"vllm": None, "error": f"{type(e).__name__}: {e}"}


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
    """:func:`_serve_dialect` and, in the same answer, :func:`requires` (one container for both)."""
    return {**_serve_dialect(), "requires": _requires_or_error()}


def _serve_dialect() -> dict[str, object]:
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
    ap.add_argument("--requires", action="store_true", help="print only the check of vLLM's Requires-Dist against "
                    "this interpreter's installed distributions")
    args = ap.parse_args(argv)
    if args.requires:
        json.dump(_requires_or_error(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    if args.serve_dialect:
        json.dump(serve_dialect(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    json.dump(facts(find_site(args.site), archs=not args.no_archs, applied=args.applied, deps=not args.site),
              sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
