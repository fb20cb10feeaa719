"""The `sparkserve` command itself: lazy command modules (the table in cli.py matches what each module
registers), --help that imports no command module, --version, "did you mean", exit codes in --help,
shell completion, and one JSON document on stdout for every --json run, errors included."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import typer
from _fixtures import REPO, clean_env, cli

from sparkserve import __version__
from sparkserve.commands import _index
from sparkserve.commands.app import MODULES


def test_the_source_index_is_what_the_modules_register() -> None:
    index = _index.command_index()
    for m in MODULES:
        sub = typer.Typer()
        importlib.import_module(f"sparkserve.commands.{m}").register(sub)
        real = [(name, (cmd.help or "").strip().split("\n\n")[0].replace("\n", " ").replace("  ", " "))
                for name, cmd in typer.main.get_group(sub).commands.items()]
        got = index[m][1]
        assert got is not None, f"{m}.register() is not read from source (it is imported on every start)"
        assert sorted(n for n, _ in got) == sorted(n for n, _ in real), m
        want = dict(real)
        for name, h in got:
            assert " ".join(h.split()) == " ".join(want[name].split()), (m, name)


def test_the_index_reads_commands_typers_and_callbacks_and_gives_up_on_anything_else() -> None:
    src = '''
import typer
grp = typer.Typer(help="The group.\\n\\nMore.")
other = typer.Typer()

@other.callback()
def _cb() -> None:
    """Callback help.

    Details."""

def run_it() -> None:
    """Run it: first line
    continued."""

def register(app):
    app.command()(run_it)
    app.command("go", help="Given help.")(run_it)
    app.add_typer(grp, name="grp")
    app.add_typer(other, name="other")
'''
    assert _index.read_module(src) == [("run-it", "Run it: first line continued."), ("go", "Given help."),
                                       ("grp", "The group."), ("other", "Callback help.")]
    assert _index.read_module(src + "\n    for x in []: pass\n") is None


PROBE = """
import sys
sys.argv = ["sparkserve", *sys.argv[1:]]
from sparkserve.cli import main
try:
    main()
except SystemExit:
    pass
loaded = sorted(m for m in sys.modules if m.startswith("sparkserve.commands.") or m in ("paramiko", "docker"))
print("LOADED", " ".join(loaded), file=sys.stderr)
"""


def _loaded(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    p = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                       env=clean_env(tmp_path), timeout=60, cwd=tmp_path)
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("LOADED"))
    return p, line.split()[1:]


def test_help_imports_no_command_module_and_status_only_its_own(tmp_path: Path) -> None:
    p, loaded = _loaded(tmp_path, "--help")
    assert loaded == ["sparkserve.commands._index", "sparkserve.commands.app", "sparkserve.commands.jsonschema"], loaded
    for _, cmds in _index.command_index().values():
        for name, _help in cmds or []:
            assert name in p.stdout
    assert "Exit codes: 0 ok" in p.stdout and "4 a swap and its rollback failed" in p.stdout
    _, loaded = _loaded(tmp_path, "status", "--help")
    assert "sparkserve.commands.deploy" in loaded and "sparkserve.commands.measure" not in loaded
    assert "paramiko" not in loaded  # status --help does not connect


def test_version_did_you_mean_and_subcommand_groups(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    p = cli("--version", env=env)
    assert p.returncode == 0 and p.stdout.strip() == f"sparkserve {__version__}"
    p = cli("statsu", env=env)
    assert p.returncode == 2 and "No such command 'statsu'. Did you mean 'status'?" in p.stderr
    p = cli("logs", "analyze", "--help", env=env)
    assert p.returncode == 0 and "Offline analysis of saved logs" in p.stdout
    p = cli("drafter", "inspect", "--help", env=env)
    assert p.returncode == 0 and "Block size, K, taps" in p.stdout


def test_shell_completion_completes_commands_and_options(tmp_path: Path) -> None:
    exe = REPO / ".venv" / "bin" / "sparkserve"
    env = clean_env(tmp_path, _SPARKSERVE_COMPLETE="complete_bash", COMP_WORDS="sparkserve swa", COMP_CWORD="1")
    p = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == ["swap-drafter"], p.stderr
    env.update(COMP_WORDS="sparkserve status --wa", COMP_CWORD="2")
    p = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert p.stdout.split() == ["--watch"]


def test_every_json_run_prints_one_document_with_its_schema_even_on_error(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n")
    for args in (["doctor", "--json", "-c", str(bad)], ["status", "--json", "-c", str(bad)],
                 ["plan", "--json", "-c", str(tmp_path / "missing.yaml")]):
        p = cli(*args, env=env)
        assert p.returncode == 2, (args, p.stderr)
        doc = json.loads(p.stdout)
        assert doc["schema"] == 1 and doc["ok"] is False and doc["error"]["exit_code"] == 2
        assert p.stderr.startswith(f"error: {doc['error']['where']}: ")
    p = cli("plan", "--json", env=env)
    assert p.returncode == 0 and json.loads(p.stdout)["schema"] == 1
