"""Judge `vllm serve` argvs the way the image's engine does: its flag dialect (:mod:`sparkserve.plan.dialects`).

Two judges with one interface:

* ``RealParser`` — vLLM's own parser (the one `vllm serve` builds), in a subprocess started once with
  ``VLLM_TARGET_DEVICE=cpu`` so this process stays light; many argvs go through one subprocess. Used
  when ``vllm`` is importable (or ``$SPARKSERVE_VLLM_PYTHON`` names an interpreter that has it) and it is
  the dialect's version.
* ``OptionList`` — a dialect's option list: the committed dump of a version's parser
  (``data/vllm-<version>-serve-args.json``, made by scripts/dump_vllm_serve_args.py: 0.33.0 from the
  light install in .venv; 0.25.1 from its PyPI wheel, ``pip install --no-deps --target DIR``, the
  dist-info version suffixed ``+cpu`` so 0.25.1's platform detection picks the CPU platform, then
  ``PYTHONPATH=DIR``), a dialect file's list built from one (the card's fork), or the list ``image verify``
  dumped from the image's own parser. Checked with argparse's rules (exact flags or unique ``--`` prefixes,
  ``=value`` forms, vLLM's ``_``→``-`` and ``--a.b`` forms).

A real parser of another version than the dialect's is not the judge: ``auto`` then falls back to the
dialect's option list, ``vllm`` is ParserUnavailable. :func:`renderable` says whether a flag exists in a
dialect (the plan renders nothing a dialect lacks, but for a setting it cannot express, which validate
refuses naming the field and the image).

Either way an unknown or misspelled flag, a missing value or a value the type rejects (``8GiB`` for
``--kv-cache-memory-bytes``) is a failed verdict that names the flag.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from sparkserve.plan.dialects import DEFAULT_DIALECT, Dialect, UnknownDialect, shipped, shipped_names

VLLM_VERSION = DEFAULT_DIALECT  # the dialect of an image nothing is known about
SUPPORTED_VERSIONS = shipped_names()  # the shipped dialects (0.33.0, 0.25.1, the card's fork)


def _dialect(version: str | Dialect) -> Dialect:
    if isinstance(version, Dialect):
        return version
    try:
        return shipped(version)
    except UnknownDialect:
        raise ParserUnavailable(f"no option list for vLLM {version} (shipped dialects: "
                                f"{', '.join(SUPPORTED_VERSIONS)})") from None


PYTHON_ENV = "SPARKSERVE_VLLM_PYTHON"
WORKER = Path(__file__).with_name("_vllm_parser_worker.py")
START_TIMEOUT_S = 180.0
CHECK_TIMEOUT_S = 60.0


class ParserUnavailable(RuntimeError):
    """vLLM's parser cannot be started here (vllm not installed, or it failed to build the parser)."""


@dataclass
class ArgvVerdict:
    ok: bool
    error: str | None = None

    @property
    def flag(self) -> str | None:
        """The flag the error is about, when the message names one."""
        if not self.error:
            return None
        m = re.search(r"(?:argument |unrecognized arguments: |ambiguous option: |invalid value for )(-[\w.+-]+)",
                      self.error)
        return m.group(1) if m else None


class Judge(Protocol):
    name: str

    def check(self, argv: list[str]) -> ArgvVerdict: ...


def vllm_python() -> str | None:
    """The interpreter that can import vllm: $SPARKSERVE_VLLM_PYTHON, else this one if it has vllm."""
    env = os.environ.get(PYTHON_ENV)
    if env:
        return env
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def installed_vllm_version() -> str | None:
    """vLLM's version in this interpreter (package metadata, nothing imported); None when another
    interpreter ($SPARKSERVE_VLLM_PYTHON) is the parser's or vllm is absent."""
    if os.environ.get(PYTHON_ENV):
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


class RealParser:
    """vLLM's own `vllm serve` parser in one long-lived subprocess. Use as a context manager."""

    def __init__(self, python: str | None = None) -> None:
        self.python = python or vllm_python()
        if not self.python:
            raise ParserUnavailable("vllm is not importable here (install the `vllm` extra: vllm==0.33.0)")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the subprocess; closed in close())
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CONFIGURE_LOGGING": "0",
               "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
        self.proc = subprocess.Popen(
            [self.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, env=env,
        )
        ready = self._read(START_TIMEOUT_S)
        if not ready or not ready.get("ready"):
            self.close()
            why = (ready or {}).get("error") or self._stderr_tail() or "no answer"
            raise ParserUnavailable(f"vLLM's parser did not start: {why}")
        self.vllm_version: str = ready.get("vllm_version", "?")
        self.name = f"vLLM {self.vllm_version} `vllm serve` parser"

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def _read(self, timeout: float) -> dict[str, Any] | None:
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                raise ParserUnavailable(f"vLLM's parser gave no answer within {timeout:.0f}s")
        finally:
            sel.close()
        line = self.proc.stdout.readline()
        return json.loads(line) if line.strip() else None

    def check(self, argv: list[str]) -> ArgvVerdict:
        if self.proc.poll() is not None:
            raise ParserUnavailable(f"vLLM's parser exited: {self._stderr_tail()}")
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(list(argv)) + "\n")
        self.proc.stdin.flush()
        got = self._read(CHECK_TIMEOUT_S)
        if got is None:
            raise ParserUnavailable(f"vLLM's parser exited: {self._stderr_tail()}")
        return ArgvVerdict(bool(got["ok"]), got.get("error"))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()

    def __enter__(self) -> RealParser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Inner types of options the dump only knows as `_optional_type(...)`: the ones sparkserve renders.
_OPTIONAL_INNER = {"kv_cache_memory_bytes": "human_readable_int", "speculative_config": "loads",
                   "kv_cache_memory": "int"}
_HRI = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def _human_readable_int(v: str) -> int:
    v = v.strip()
    m = _HRI.fullmatch(v)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(v)


def _convert(type_name: str | None, value: str) -> None:
    """Raise ValueError when ``value`` is not what the option's type accepts."""
    if type_name == "int":
        int(value)
    elif type_name == "float":
        float(value)
    elif type_name == "human_readable_int":
        _human_readable_int(value)
    elif type_name == "human_readable_int_or_auto":
        if value.strip() not in ("-1",) and value.strip().lower() != "auto":
            _human_readable_int(value)
    elif type_name in ("loads", "parse_dataclass"):
        json.loads(value)


def _is_negative_number(arg: str) -> bool:
    return re.fullmatch(r"-\d+$|-\d*\.\d+$", arg) is not None


class OptionList:
    """The committed option list, checked with argparse's rules (no vLLM needed)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.vllm_version = str(data.get("vllm_version"))
        self.name = f"vLLM {self.vllm_version} option list (committed dump)"
        self.by_flag: dict[str, dict[str, Any]] = {}
        for opt in data["options"]:
            for s in opt["option_strings"]:
                self.by_flag[s] = opt
        self.long_flags = sorted(f for f in self.by_flag if f.startswith("--"))

    @classmethod
    def load(cls, path: Path | None = None, *, version: str | Dialect = VLLM_VERSION) -> OptionList:
        """The option list at ``path``, else the one of dialect ``version`` (a name or a Dialect)."""
        if path:
            return cls(json.loads(path.read_text()))
        d = _dialect(version)
        out = cls(d.options)
        out.name = (f"{d.title} {d.vllm_version} ({d.list_origin})" if d.title else
                    f"vLLM {d.vllm_version} option list ({d.list_origin})")
        return out

    def accepts(self, flag: str) -> bool:
        """``flag`` (``--name``, without a value) is an option of this version (exactly, not a prefix)."""
        return flag in self.by_flag

    def lookup(self, flag: str) -> tuple[str, dict[str, Any]] | None:
        if flag in self.by_flag:
            return flag, self.by_flag[flag]
        if flag.startswith("--"):  # argparse allow_abbrev: a unique prefix of a long option
            hits = [f for f in self.long_flags if f.startswith(flag)]
            if len({id(self.by_flag[h]) for h in hits}) == 1:
                return hits[0], self.by_flag[hits[0]]
            if len(hits) > 1:
                raise _Reject(f"ambiguous option: {flag} could match {', '.join(hits)}")
        return None

    def _preprocess(self, args: list[str]) -> list[str]:
        """vLLM's FlexibleArgumentParser rewrites: ``_``→``-`` in names, ``-O3``, ``--a.b v`` → JSON."""
        out: list[str] = []
        dotted: dict[str, dict[str, Any]] = {}
        i = 0
        while i < len(args):
            a = args[i]
            if a.startswith("--"):
                key, eq, value = a.partition("=")
                head, dot, rest = key[2:].partition(".")
                key = "--" + head.replace("_", "-") + dot + rest
                a = key + eq + value
            elif a.startswith("-O") and a != "-O":
                out += ["--optimization-level", a[3:] if a[2:3] == "=" else a[2:]]
                i += 1
                continue
            if a.startswith("-") and "." in a.partition("=")[0]:
                key, eq, value = a.partition("=")
                if not eq:
                    if i + 1 >= len(args):
                        raise _Reject(f"argument {key}: expected one argument")
                    value = args[i + 1]
                    i += 1
                base, *path = key.rstrip("+").split(".")
                try:
                    parsed: Any = json.loads(value)
                except json.JSONDecodeError:
                    parsed = value
                node = dotted.setdefault(base, {})
                for p in path[:-1]:
                    node = node.setdefault(p, {})
                node[path[-1]] = parsed
                i += 1
                continue
            out.append(a)
            i += 1
        for base, value in dotted.items():
            out += [base, json.dumps(value)]
        return out

    def check(self, argv: list[str]) -> ArgvVerdict:
        args = list(argv)
        if args[:2] == ["vllm", "serve"]:
            args = args[2:]
        elif args[:1] == ["serve"]:
            args = args[1:]
        else:
            return ArgvVerdict(False, "not a `vllm serve` argv")
        try:
            self._walk(self._preprocess(args))
        except _Reject as e:
            return ArgvVerdict(False, str(e))
        return ArgvVerdict(True)

    def _walk(self, args: list[str]) -> None:
        positional_seen = False
        extras: list[str] = []
        i = 0
        while i < len(args):
            a = args[i]
            i += 1
            if a == "--":
                extras += args[i:]
                break
            if not a.startswith("-") or a == "-" or _is_negative_number(a):
                if positional_seen:
                    extras.append(a)
                positional_seen = True
                continue
            flag, eq, inline = a.partition("=")
            found = self.lookup(flag)
            if found is None:
                extras.append(a)
                # argparse skips the unknown flag's would-be values too, reporting them with it
                while i < len(args) and not args[i].startswith("-"):
                    extras.append(args[i])
                    i += 1
                continue
            name, opt = found
            nargs = opt["nargs"]
            if nargs == 0:
                if eq:
                    raise _Reject(f"argument {name}: ignored explicit argument {inline!r}")
                continue
            values: list[str] = []
            if eq:
                values = [inline]
            elif nargs in (None, "+"):
                while i < len(args) and (not args[i].startswith("-") or _is_negative_number(args[i])):
                    values.append(args[i])
                    i += 1
                    if nargs is None:
                        break
                if not values:
                    want = "one argument" if nargs is None else "at least one argument"
                    raise _Reject(f"argument {name}: expected {want}")
            elif nargs == "?" and i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
            type_name = _OPTIONAL_INNER.get(opt["dest"]) if opt["type"] == "_optional_type" else opt["type"]
            for v in values:
                if opt["choices"] is not None and v not in [str(c) for c in opt["choices"]]:
                    raise _Reject(f"argument {name}: invalid choice: {v!r}")
                try:
                    _convert(type_name, v)
                except (ValueError, TypeError):
                    raise _Reject(f"argument {name}: invalid {type_name} value: {v!r}") from None
                if isinstance(opt["metavar"], list) and opt["choices"] is None:
                    accepted = [str(m) for m in opt["metavar"]]
                    if v not in accepted and not (opt["dest"] == "distributed_executor_backend" and "." in v):
                        raise _Reject(f"argument {name}: invalid value {v!r} (accepted: {', '.join(accepted)})")
        if extras:
            raise _Reject(f"unrecognized arguments: {' '.join(extras)}")


def renderable(flag: str, version: str | Dialect = VLLM_VERSION) -> bool:
    """Whether dialect ``version``'s `vllm serve` has option ``flag`` (the plan renders no other)."""
    return _dialect(version).accepts(flag)


class _Reject(Exception):
    """The option list rejects an argv, with argparse's own wording."""


def get_judge(mode: Literal["auto", "vllm", "list"] = "auto", version: str | Dialect = VLLM_VERSION,
              ) -> RealParser | OptionList:
    """The judge for dialect ``version``. ``vllm``: the real parser, ParserUnavailable when it cannot start
    or is another version; ``list``: the dialect's option list; ``auto``: the real parser if it is that
    version, else the option list."""
    d = _dialect(version)  # an unknown dialect is refused before anything starts
    if mode == "list":
        return OptionList.load(version=d)
    if mode == "vllm":
        return _real_of(d)
    if not vllm_python() or installed_vllm_version() not in (None, d.vllm_version):
        return OptionList.load(version=d)
    try:
        return _real_of(d)
    except ParserUnavailable:
        return OptionList.load(version=d)


def _real_of(d: Dialect) -> RealParser:
    """The real parser of dialect ``d``. When this interpreter's vLLM is another version (its package metadata
    says so), refused before the parser starts: starting it imports vLLM, ~8 s of CPU, to learn what the
    metadata already says. Another interpreter ($SPARKSERVE_VLLM_PYTHON) is asked by starting its parser."""
    def refuse(found: str) -> ParserUnavailable:
        return ParserUnavailable(f"the installed vLLM is {found}, but the engine's dialect is vLLM "
                                 f"{d.vllm_version} ({d.source or 'serve.vllm_version'}; set {PYTHON_ENV} to a "
                                 f"python with vLLM {d.vllm_version}, or use --parser list)")

    known = installed_vllm_version() if vllm_python() else None
    if known is not None and known != d.vllm_version:
        raise refuse(known)
    real = RealParser()
    if real.vllm_version != d.vllm_version:
        real.close()
        raise refuse(real.vllm_version)
    return real


def check_argvs(argvs: list[list[str]], judge: RealParser | OptionList | None = None,
                version: str | Dialect = VLLM_VERSION) -> tuple[str, list[ArgvVerdict]]:
    """(judge name, one verdict per argv). Starts (and stops) a judge when none is given."""
    own = judge is None
    j = judge or get_judge(version=version)
    try:
        return j.name, [j.check(a) for a in argvs]
    finally:
        if own and isinstance(j, RealParser):
            j.close()
