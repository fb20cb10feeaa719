"""The one way the models stage opens an input file: regular files only, never blocking, never unbounded.

A drafter or target directory is user input, and a user (or an attacker) can put anything behind a
name: a FIFO (``open`` blocks until a writer appears, i.e. forever), a device (``/dev/zero`` never ends,
``/dev/tty`` blocks), a socket, a symlink to any of them, a 6 GB file where a 2 KB config belongs, JSON
nested 100,000 deep (``json.loads`` raises RecursionError). Every reader in this stage goes through here,
so each of those is a :class:`BadFile` whose message says what is wrong; callers name the file and turn it
into BadInput (exit 2) or a drafter ``Problem``.

    data = parse_json(read_regular(path, limit=CONFIG_LIMIT))   # BadFile, never a hang or a traceback
    with open_regular(path) as f: ...                         # a file object of a regular file
    cfg = read_config(model_dir)                              # config.json as a dict, else BadInput

The config.json field readers (``as_int``, ``name_list``) live here too, for the drafter and the target alike:
a field of the wrong JSON type is "not set" or BadInput, never a TypeError later.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from sparkserve.errors import BadInput

# Size caps per kind of file, far above any real one: HF config.json files are a few KB, a drafter's
# index a few KB (a 600-shard target's is ~10 MB), mask_embedding.pt one hidden-size row (~16 KB).
CONFIG_LIMIT = 4 * 2**20
INDEX_LIMIT = 64 * 2**20
MASK_LIMIT = 64 * 2**20
# Real configs and safetensors headers nest 3-4 levels. Anything parsed deeper than this would later
# overflow the recursion of dataclasses.asdict / json.dumps when the facts are printed.
JSON_MAX_DEPTH = 64

_O_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class BadFile(ValueError):
    """An input file that cannot be used; the message says what is wrong, without the path (callers name it)."""


class MissingFile(BadFile):
    """The file does not exist (or is a dangling symlink)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _refuse_special(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise BadFile(f"is a {_kind(mode)}, not a regular file")


def open_regular(path: Path) -> BinaryIO:
    """``path`` (symlinks followed) opened for binary reading; BadFile unless it is a regular file.

    The type is checked with stat before opening, because merely opening a device can act (rewind a
    tape, wait for a modem line); the open is O_NONBLOCK and checked again with fstat, so a file swapped
    for a FIFO in between still cannot block."""
    try:
        _refuse_special(os.stat(path).st_mode)
        fd = os.open(path, _O_FLAGS)
    except FileNotFoundError:
        raise MissingFile("missing") from None
    except OSError as e:
        raise BadFile(f"cannot read: {e.strerror or e}") from None
    try:
        _refuse_special(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: Path, *, limit: int) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes; BadFile otherwise."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise BadFile(f"is {size:,} bytes; refusing to read more than {limit:,}")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise BadFile(f"cannot read: {e.strerror or e}") from None
    if len(data) > limit:  # it grew while being read
        raise BadFile(f"is over {limit:,} bytes; refusing to read more")
    return data


def parse_json(data: bytes | str) -> Any:
    """JSON text as Python data; BadFile (never RecursionError, UnicodeDecodeError …) when it is not usable."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise BadFile(f"not valid JSON: nested more than {JSON_MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as e:
        raise BadFile(f"not valid JSON: {e.msg} at line {e.lineno}") from None
    except UnicodeDecodeError:
        raise BadFile("not valid JSON: not UTF-8 text") from None
    except ValueError as e:  # e.g. an integer of more digits than int() converts
        raise BadFile(f"not valid JSON: {e}") from None
    if _depth(obj) > JSON_MAX_DEPTH:
        raise BadFile(f"not valid JSON: nested more than {JSON_MAX_DEPTH} levels deep")
    return obj


def _depth(obj: Any) -> int:
    """How deep lists and objects nest in ``obj`` (iterative: it must not recurse itself)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d <= JSON_MAX_DEPTH:  # deeper is already an answer
                stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def read_config(path: Path, *, where: str = "drafter.path") -> dict[str, Any]:
    """A model dir's config.json as a dict; BadInput naming the dir (``where``) or the file when unusable."""
    if not path.exists():
        raise BadInput(where, f"{path} does not exist")
    if not path.is_dir():
        raise BadInput(where, f"{path} is not a directory")
    cfg_file = path / "config.json"
    try:
        data = parse_json(read_regular(cfg_file, limit=CONFIG_LIMIT))
    except MissingFile:
        raise BadInput(str(cfg_file), "missing (a model directory needs config.json)") from None
    except BadFile as e:
        raise BadInput(str(cfg_file), str(e)) from None
    if not isinstance(data, dict):
        raise BadInput(str(cfg_file), "must be a JSON object")
    return data


# Counts and ids beyond this are not integers any model has; bounding them keeps the float arithmetic
# of KV sizing (bytes per token x layers x heads) from overflowing.
_INT_BOUND = 2**63


def as_int(v: Any) -> int | None:
    """A config field as an int, or None when it is absent, a bool, another type or out of range."""
    if isinstance(v, int) and not isinstance(v, bool) and -_INT_BOUND < v < _INT_BOUND:
        return v
    return None


def name_list(cfg: dict[str, Any], key: str, cfg_file: Path) -> list[str]:
    """``cfg[key]`` as a list of names (``architectures``; [] when absent); BadInput when it is not one."""
    v = cfg.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise BadInput(str(cfg_file), f"{key} must be a list of names")
    return list(v)
