"""Read every logger call with a literal format string out of an installed vLLM package (dev + test aid).

    python tests/rig/tools/vllm_formats.py [SUBSTRING ...]     # prints file:line LEVEL format

Used by tests/rig/test_formats_table.py to prove that each entry of formats_033.py is a real 0.33.0
format string at the file:line the emulator prints. Reads source with ``ast`` only; imports nothing
from vLLM.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARNING", "error": "ERROR", "critical": "CRITICAL",
          "exception": "ERROR", "info_once": "INFO", "warning_once": "WARNING", "debug_once": "DEBUG"}


@dataclass(frozen=True)
class LoggerCall:
    path: str  # relative to the package root, e.g. "v1/engine/core.py"
    line: int  # the call's first line: what Python's logging puts into [file:line]
    level: str
    fmt: str


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        return a + b if a is not None and b is not None else None
    if isinstance(node, ast.JoinedStr):  # f-string: keep literal parts, mark holes with {}
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            else:
                out.append("{}")
        return "".join(out)
    return None


def package_root() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def logger_calls(root: Path) -> Iterator[LoggerCall]:
    for f in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            level = LEVELS.get(node.func.attr)
            if level is None or not node.args:
                continue
            recv = node.func.value
            name = recv.id if isinstance(recv, ast.Name) else getattr(recv, "attr", "")
            if "log" not in name.lower() and name != "lgr":
                continue
            fmt = _literal(node.args[0])
            if fmt is not None:
                yield LoggerCall(str(f.relative_to(root)), node.lineno, level, fmt)


def string_literals(path: Path) -> list[tuple[int, str]]:
    """Every string literal expression of a file (f-string holes as ``{}``), with its first line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)):
            text = _literal(node)
            if text:
                out.append((node.lineno, text))
    return out


def main() -> None:
    root = package_root()
    if root is None:
        sys.exit("vllm is not importable here")
    subs = sys.argv[1:]
    for c in logger_calls(root):
        if not subs or any(s in c.fmt for s in subs):
            print(f"{c.path}:{c.line} {c.level} {c.fmt!r}")


if __name__ == "__main__":
    main()
