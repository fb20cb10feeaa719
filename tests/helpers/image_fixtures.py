"""Fixtures for the image tests: real git format-patch files, ELF files with a generated .nv_fatbin, the
stdlib tools under docker/tools imported by path.

    patch = format_patch(tmp, "vllm/config/speculative.py", old, new, upstream="vllm-project/vllm#1")
    so = elf_with_fatbin([(2, 121, FLAGS_121A, b"..."), (1, 120, PLAIN, b".target sm_120f")])
    apply_series = tool("apply_series"); image_facts = tool("image_facts")
"""

from __future__ import annotations

import importlib.util
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "docker" / "tools"
VENV_SITE = next((REPO / ".venv" / "lib").glob("python3*/site-packages"), None)

PLAIN = 0x11  # 64-bit | linux, uncompressed
OLD_A = 0x100000
NEW_ABI = 0x1000000
NEW_A = 0x200000
ZSTD = 0x8000


def tool(name: str) -> ModuleType:
    """``docker/tools/<name>.py`` imported as a module (it is a standalone program, not a package module)."""
    spec = importlib.util.spec_from_file_location(f"sparkserve_tool_{name}", TOOLS / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def git(cwd: Path, *args: str) -> str:
    res = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                         capture_output=True, text=True, check=True)
    return res.stdout


def format_patch(work: Path, rel: str, old: str, new: str, *, upstream: str = "vllm-project/vllm#40000 (open)",
                 base: str = "vllm 0.33.0 g4ba787ec9", touches: str | None = None, subject: str = "test change"
                 ) -> bytes:
    """A real ``git format-patch`` of one file changing from ``old`` to ``new`` (``a/<rel>`` paths), with the
    series headers in the commit message."""
    repo = work / f"fp-{abs(hash((rel, old, new, upstream))) % 10**8}"
    shutil.rmtree(repo, ignore_errors=True)
    (repo / rel).parent.mkdir(parents=True)
    git(repo.parent, "init", "-q", str(repo))
    (repo / rel).write_text(old)
    git(repo, "add", rel)
    git(repo, "commit", "-q", "-m", "base")
    (repo / rel).write_text(new)
    msg = f"{subject}\n\nUpstream: {upstream}\nBase: {base}\nTouches: {touches if touches is not None else rel}\n"
    git(repo, "commit", "-q", "-am", msg)
    return git(repo, "format-patch", "-1", "--stdout").encode()


def elf_with_fatbin(entries: list[tuple[int, int, int, bytes]]) -> bytes:
    """A 64-bit little-endian ELF whose ``.nv_fatbin`` section is one fatbin container holding ``entries``
    (kind 1 PTX / 2 cubin, sm arch number, entry flags, payload), laid out as the wheels' fatbins are."""
    body = b""
    for kind, arch, flags, payload in entries:
        size = len(payload) + (-len(payload) % 8)
        head = struct.pack("<HHIQ", kind, 0x0101, 64, size)
        head += struct.pack("<IIHHI", len(payload), 0, 1, 8, arch)  # compressed size, ?, minor/major, arch
        head += struct.pack("<IIQ", 0, 0, flags)
        head += b"\0" * (64 - len(head))
        body += head + payload + b"\0" * (size - len(payload))
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    shstrtab = b"\0.nv_fatbin\0.shstrtab\0"
    data_off = 64
    str_off = data_off + len(fatbin)
    sh_off = str_off + len(shstrtab) + (-(str_off + len(shstrtab)) % 8)
    ehdr = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    ehdr += struct.pack("<HHIQQQIHHHHHH", 3, 0x3E, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, data_off, len(fatbin), 0, 0, 8, 0),
                struct.pack("<IIQQQQIIQQ", 11, 3, 0, 0, str_off, len(shstrtab), 0, 0, 1, 0)]
    out = ehdr + fatbin + shstrtab
    out += b"\0" * (sh_off - len(out))
    return out + b"".join(sections)
