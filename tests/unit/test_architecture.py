"""docs/ARCHITECTURE.md's import rules, read off the code: stages import only downward, no import circles,
and the pure stages never reach a node or the network."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "sparkserve"

# Lowest first. A module may import from its own stage or any stage before it (docs/ARCHITECTURE.md).
STAGES = ["ground", "models", "plan", "observe", "measure", "nodes", "image", "deploy", "campaign", "operate",
          "commands", "docgen"]
GROUND = {"__init__", "errors", "units", "config", "interrupts", "journal"}
TOP = {"cli", "__main__"}  # the CLI entry points: the commands stage
PURE = {"models", "plan", "observe"}
NETWORK = {"paramiko", "docker", "httpx", "socket", "requests", "urllib3", "ssl", "subprocess"}
# plan/vllm_args runs vLLM's own parser in a local child process: a computation, not a node or the network.
NETWORK_EXCEPTIONS = {("sparkserve.plan.vllm_args", "subprocess")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "ground"
    if parts[1] in GROUND:  # a ground module, or a ground package's part (journal/)
        return "ground"
    if len(parts) == 2 and parts[1] in TOP:
        return "commands"
    if parts[1] in STAGES:
        return parts[1]
    raise AssertionError(f"{module}: not in any stage of docs/ARCHITECTURE.md (add it there and here)")


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """Every import in the file, module level and inside functions, as (absolute module, line)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out.append((base, node.lineno))
            for a in node.names:  # `from sparkserve.deploy import up` imports the module sparkserve.deploy.up
                if f"{base}.{a.name}" in modules:
                    out.append((f"{base}.{a.name}", node.lineno))
    return out


def graph() -> dict[str, list[tuple[str, int]]]:
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def layering_violations(g: dict[str, list[tuple[str, int]]]) -> list[str]:
    bad = []
    for src, deps in g.items():
        s = STAGES.index(stage_of(src))
        for dst, line in deps:
            if dst == "sparkserve" or not dst.startswith("sparkserve."):
                continue
            d = STAGES.index(stage_of(dst))
            if d > s:
                bad.append(f"{src}:{line} imports {dst} ({stage_of(src)} may not import {stage_of(dst)})")
    return bad


def network_violations(g: dict[str, list[tuple[str, int]]]) -> list[str]:
    bad = []
    for src, deps in g.items():
        if stage_of(src) not in PURE:
            continue
        for dst, line in deps:
            top = dst.split(".")[0]
            if top in NETWORK and (src, top) not in NETWORK_EXCEPTIONS:
                bad.append(f"{src}:{line} imports {dst} ({stage_of(src)}/ does no node or network I/O)")
    return bad


def cycles(g: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each a circle of imports."""
    edges = {m: sorted({d for d, _ in deps if d in g and d != m}) for m, deps in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for m in edges:
        if m not in index:
            visit(m)
    return found


def package_parents(g: dict[str, list[tuple[str, int]]]) -> dict[str, list[tuple[str, int]]]:
    """A stage's ``__init__`` re-exporting its modules is not a circle: drop package → own-submodule edges."""
    return {m: [(d, ln) for d, ln in deps if not d.startswith(m + ".")] for m, deps in g.items()}


def test_every_module_belongs_to_a_stage() -> None:
    for m in graph():
        assert stage_of(m) in STAGES


def test_stages_import_only_downward() -> None:
    assert layering_violations(graph()) == []


def test_no_import_circle() -> None:
    assert cycles(package_parents(graph())) == []


def test_models_plan_observe_never_reach_a_node_or_the_network() -> None:
    assert network_violations(graph()) == []


def test_stage_folders_say_what_they_may_import() -> None:
    for stage in STAGES[1:-1]:
        doc = ast.get_docstring(ast.parse((PKG / stage / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"sparkserve/{stage}/__init__.py: docstring must state what the stage may import"


def test_architecture_doc_names_every_stage_folder() -> None:
    doc = (PKG.parent / "docs" / "ARCHITECTURE.md").read_text()
    for stage in STAGES[1:]:
        assert f"`{stage}/`" in doc, stage
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - GROUND
    assert folders == set(STAGES[1:]), f"stage folders on disk {sorted(folders)} differ from STAGES"


# The checks themselves must be able to fail.

@pytest.mark.parametrize(("src", "dst", "why"), [
    ("sparkserve.observe.gates", "sparkserve.deploy.up", "observe may not import deploy"),
    ("sparkserve.plan.build", "sparkserve.nodes.engine", "plan may not import nodes"),
    ("sparkserve.config", "sparkserve.models.drafter", "ground may not import models"),
])
def test_an_upward_import_is_caught(src: str, dst: str, why: str) -> None:
    assert layering_violations({src: [(dst, 7)]}) == [f"{src}:7 imports {dst} ({why})"]


def test_a_network_import_in_a_pure_stage_is_caught() -> None:
    assert network_violations({"sparkserve.observe.logs": [("httpx", 3)]}) == [
        "sparkserve.observe.logs:3 imports httpx (observe/ does no node or network I/O)"]
    assert network_violations({"sparkserve.plan.vllm_args": [("subprocess", 3)]}) == []


def test_a_circle_is_caught() -> None:
    g = {"sparkserve.nodes.ssh": [("sparkserve.nodes.docker_client", 1)],
         "sparkserve.nodes.docker_client": [("sparkserve.nodes.ssh", 9)], "sparkserve.errors": []}
    assert cycles(g) == [["sparkserve.nodes.docker_client", "sparkserve.nodes.ssh"]]


def test_relative_and_function_level_imports_are_read(tmp_path: Path) -> None:
    f = PKG / "observe" / "logs.py"  # a real module path, so names resolve; its text is ours
    text = "from . import gates\ndef f():\n    from ..deploy import up\n"
    tree_imports = imports_of_text(f, text, {"sparkserve.observe.gates", "sparkserve.deploy.up"})
    assert ("sparkserve.observe.gates", 1) in tree_imports and ("sparkserve.deploy.up", 3) in tree_imports


def imports_of_text(path: Path, text: str, modules: set[str]) -> list[tuple[str, int]]:
    fake = type("P", (), {"read_text": lambda self: text, "name": path.name,
                          "relative_to": lambda self, other: path.relative_to(other),
                          "__str__": lambda self: str(path)})()
    return imports_of(fake, modules)  # type: ignore[arg-type]


def cli_imports(g: dict[str, list[tuple[str, int]]]) -> list[str]:
    """commands/ holds the app and its commands; the process entry (cli.py) stands on them, never the reverse."""
    return [f"{src}:{line} imports {dst} (commands/ never imports the CLI entry)"
            for src, deps in g.items() if src.startswith("sparkserve.commands")
            for dst, line in deps if dst in ("sparkserve.cli", "sparkserve.__main__")]


def test_commands_never_import_the_cli_entry() -> None:
    assert cli_imports(graph()) == []


def test_a_commands_import_of_the_cli_is_caught() -> None:
    assert cli_imports({"sparkserve.commands.profiles": [("sparkserve.cli", 15)]}) == [
        "sparkserve.commands.profiles:15 imports sparkserve.cli (commands/ never imports the CLI entry)"]
