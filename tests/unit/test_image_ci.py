"""The image workflow's own steps: scripts/image-ci lint (hadolint + actionlint, which also run in
scripts/test) passes on the tree and fails on a broken Dockerfile or workflow; the workflow only runs
scripts/ and sparkserve commands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"


def test_image_ci_lint_passes_on_the_tree() -> None:
    res = subprocess.run([str(REPO / "scripts" / "image-ci"), "lint"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_fails_a_dockerfile_that_breaks_the_rules(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text((REPO / "docker/Dockerfile").read_text().replace(
        "RUN apt-get update", "RUN cd /tmp && apt-get update", 1).replace("# hadolint ignore=DL3008\n", "", 1))
    res = subprocess.run([str(BIN / "hadolint"), str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "DL3003" in res.stdout and "DL3008" in res.stdout


def test_actionlint_fails_a_workflow_with_a_bad_runner_and_need(tmp_path: Path) -> None:
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    text = (REPO / ".github/workflows/image.yml").read_text()
    (wf / "image.yml").write_text(text.replace("ubuntu-24.04-arm", "ubuntu-24.04-armm").replace(
        "needs: [lint, series]", "needs: [lint, seriez]", 1))
    res = subprocess.run([str(BIN / "actionlint"), str(wf / "image.yml")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0
    assert "ubuntu-24.04-armm" in res.stdout and "seriez" in res.stdout


def test_every_workflow_step_runs_a_scripts_or_sparkserve_command() -> None:
    wf = yaml.safe_load((REPO / ".github/workflows/image.yml").read_text())
    runs = [s["run"] for job in wf["jobs"].values() for s in job["steps"] if "run" in s]
    assert runs
    for run in runs:
        for line in filter(None, (x.strip() for x in run.splitlines())):
            cmd = line.removeprefix("sudo ").split()[0]
            assert cmd.startswith("scripts/") or cmd == ".venv/bin/sparkserve", line
            assert (REPO / cmd).is_file(), cmd
    used = set(re.findall(r"scripts/image-ci (\w+)", "\n".join(runs)))
    assert used == {"lint", "series"}  # both are run by this suite (here and in test_image_series.py)
