"""The real-engine harness (scripts/real-engine, tests/real) stays runnable though CI never runs it on a GPU:
shellcheck-clean, never collected by the default run, its scenario starts (argument errors are its own)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "real-engine"


def test_real_engine_script_is_shellcheck_clean() -> None:
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is not installed (scripts/setup installs it)"
    p = subprocess.run([exe, str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_an_unknown_verb_prints_the_usage_and_exits_2() -> None:
    p = subprocess.run([str(SCRIPT), "nope"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "scripts/real-engine bundle" in p.stderr


def test_tests_real_is_never_collected_by_the_default_run() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("tests_conftest", REPO / "tests" / "conftest.py")
    assert spec and spec.loader
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert "real" in conftest.collect_ignore  # pytest skips tests/real below tests/ (no GPU in CI)


def test_the_real_scenario_refuses_a_real_run_without_the_carried_site(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(REPO / "tests" / "real" / "real_scenario.py"), "--engine", "real",
                        "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--engine real needs --site" in p.stderr
