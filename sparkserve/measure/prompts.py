"""Bench prompts: a JSONL file, one ``{"prompt": "…"}`` or ``{"messages": [...]}`` object per line.

The model card's holdout file (``prompts_holdout_500.jsonl``: ``{"id", "source", "prompt"}`` per line) is
read as it is: ``prompt`` becomes one user turn, ``id`` is kept, other keys are ignored.

Example::

    prompts = load_prompts(Path("prompts.jsonl"))    # BadInput("prompts.jsonl:7", ...) on a bad line
    prompts = builtin_prompts()                      # the small set shipped for the smoke cell
    prompts[0].messages                              # [{"role": "user", "content": "…"}]
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sparkserve.errors import BadInput

BUILTIN_NAME = "builtin:smoke_prompts.jsonl"
_ROLES = {"system", "user", "assistant", "developer", "tool"}


@dataclass(frozen=True)
class Prompt:
    """One request's chat messages, as the ``messages`` field of a chat completion; ``id`` as the file gave it."""

    messages: list[dict[str, Any]]
    id: str | None = None


@dataclass(frozen=True)
class PromptSet:
    """The prompts a cell cycles through, with where they came from (both go into the bench record)."""

    source: str  # file path, or BUILTIN_NAME
    sha256: str  # of the file's bytes
    prompts: list[Prompt]

    def __len__(self) -> int:
        return len(self.prompts)


def _parse_line(obj: Any) -> Prompt:
    if not isinstance(obj, dict):
        raise ValueError("each line must be a JSON object with a \"prompt\" or \"messages\" key")
    if "prompt" in obj and "messages" in obj:
        raise ValueError("give either \"prompt\" or \"messages\", not both")
    pid = obj.get("id")
    if pid is not None and not isinstance(pid, str | int):
        raise ValueError("\"id\" must be a string or a number")
    pid = None if pid is None else str(pid)
    if "prompt" in obj:
        p = obj["prompt"]
        if not isinstance(p, str) or not p.strip():
            raise ValueError("\"prompt\" must be a non-empty string")
        return Prompt(messages=[{"role": "user", "content": p}], id=pid)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("\"messages\" must be a non-empty list")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in _ROLES or "content" not in m:
                raise ValueError(
                    f"messages[{i}] must be an object with a role ({', '.join(sorted(_ROLES))}) and content"
                )
        return Prompt(messages=msgs, id=pid)
    raise ValueError("each line needs a \"prompt\" or \"messages\" key")


def parse_prompts(text: str, source: str) -> list[Prompt]:
    """Parse JSONL text; blank lines are skipped. Raises BadInput naming ``source:line``."""
    out: list[Prompt] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(_parse_line(json.loads(line)))
        except json.JSONDecodeError as e:
            raise BadInput(f"{source}:{n}", f"not valid JSON ({e.msg} at column {e.colno})") from e
        except ValueError as e:
            raise BadInput(f"{source}:{n}", str(e)) from e
    if not out:
        raise BadInput(source, "holds no prompts")
    return out


def load_prompts(path: Path) -> PromptSet:
    """A JSONL prompt file; BadInput naming the file (and line) when it cannot be used."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(str(path), f"cannot read ({e.strerror or e})") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(str(path), "is not UTF-8 text") from e
    prompts = parse_prompts(text, str(path))
    return PromptSet(source=str(path), sha256=hashlib.sha256(raw).hexdigest(), prompts=prompts)


def builtin_prompts() -> PromptSet:
    """The small prompt set shipped with sparkserve (the smoke cell's and the smoke gate's)."""
    raw = resources.files("sparkserve").joinpath("data/smoke_prompts.jsonl").read_bytes()
    return PromptSet(
        source=BUILTIN_NAME,
        sha256=hashlib.sha256(raw).hexdigest(),
        prompts=parse_prompts(raw.decode("utf-8"), BUILTIN_NAME),
    )
