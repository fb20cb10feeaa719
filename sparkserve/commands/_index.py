"""Which top-level commands each command module registers, with their one-line help — read from the
modules' source, without importing them (that is what keeps `sparkserve --help` fast).

A module's ``register(app)`` is read for ``app.command("name")(fn)`` / ``app.command()(fn)`` (help: the
first paragraph of ``fn``'s docstring) and ``app.add_typer(x, name="name")`` (help: ``x = typer.Typer(help=…)``,
or the docstring of ``@x.callback``). A new command a module registers this way is listed and dispatched
without touching cli.py. The result is cached by each file's size and mtime (``$XDG_CACHE_HOME/sparkserve``);
a module whose ``register`` cannot be read this way is imported instead (``None`` here).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

MODULES = ("core", "deploy", "observe", "measure", "tune", "image", "operate", "profiles", "hosts")
HERE = Path(__file__).resolve().parent
CACHE_VERSION = 1


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    para = doc.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in para.splitlines())


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _typer_help(tree: ast.Module, var: str) -> str:
    """``var = typer.Typer(help=…)``'s help, else the docstring of ``@var.callback``."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var for t in stmt.targets) \
                and isinstance(stmt.value, ast.Call):
            for kw in stmt.value.keywords:
                if kw.arg == "help" and (text := _const_str(kw.value)) is not None:
                    return _first_paragraph(text)
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef):
            for d in stmt.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                if isinstance(f, ast.Attribute) and f.attr == "callback" and isinstance(f.value, ast.Name) \
                        and f.value.id == var:
                    return _first_paragraph(ast.get_docstring(stmt))
    return ""


def read_module(source: str) -> list[tuple[str, str]] | None:
    """(name, help) of every top-level command ``register(app)`` adds, in order; None when it cannot tell."""
    tree = ast.parse(source)
    funcs = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    reg = funcs.get("register")
    if reg is None or not reg.args.args:
        return None
    app = reg.args.args[0].arg
    out: list[tuple[str, str]] = []
    for stmt in reg.body:
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
            return None
        call = stmt.value
        f = call.func
        if isinstance(f, ast.Call) and isinstance(f.func, ast.Attribute) and f.func.attr == "command" \
                and isinstance(f.func.value, ast.Name) and f.func.value.id == app and len(call.args) == 1 \
                and isinstance(call.args[0], ast.Name):
            fn = call.args[0].id
            name = _const_str(f.args[0]) if f.args else None
            name = name or next((_const_str(k.value) for k in f.keywords if k.arg == "name"), None)
            name = name or fn.lower().replace("_", "-")
            fdef = funcs.get(fn)
            help_kw = next((_const_str(k.value) for k in f.keywords if k.arg == "help"), None)
            out.append((name, _first_paragraph(help_kw or (ast.get_docstring(fdef) if fdef else None))))
        elif isinstance(f, ast.Attribute) and f.attr == "add_typer" and isinstance(f.value, ast.Name) \
                and f.value.id == app and call.args and isinstance(call.args[0], ast.Name):
            name = next((_const_str(k.value) for k in call.keywords if k.arg == "name"), None)
            if name is None:
                return None
            out.append((name, _typer_help(tree, call.args[0].id)))
        else:
            return None
    return out


def _cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sparkserve" / "cli-index.json"


def command_index() -> dict[str, tuple[str, list[tuple[str, str]] | None]]:
    """module → (its file's "size:mtime_ns" stamp, its commands or None), for every command module."""
    stamps = {}
    for m in MODULES:
        st = (HERE / f"{m}.py").stat()
        stamps[m] = f"{st.st_size}:{st.st_mtime_ns}"
    cache = _cache_path()
    try:
        data = json.loads(cache.read_text())
        if data.get("version") == CACHE_VERSION and data.get("dir") == str(HERE) and \
                all(data["modules"].get(m, [None])[0] == stamps[m] for m in MODULES):
            return {m: (stamps[m], [tuple(x) for x in data["modules"][m][1]] if data["modules"][m][1] is not None
                        else None) for m in MODULES}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    out: dict[str, tuple[str, list[tuple[str, str]] | None]] = {}
    for m in MODULES:
        try:
            out[m] = (stamps[m], read_module((HERE / f"{m}.py").read_text()))
        except (OSError, SyntaxError, ValueError):
            out[m] = (stamps[m], None)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "dir": str(HERE),
                                   "modules": {m: [s, c] for m, (s, c) in out.items()}}))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home: parse again next time
    return out
