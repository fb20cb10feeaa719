"""The built wheel ships templates/ and the package data, and `sparkserve render` works from it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from _fixtures import REPO


def test_wheel_ships_templates_and_renders_from_an_installed_copy(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (wheel,) = dist.glob("sparkserve-*.whl")
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name == f"sparkserve-{version}-py3-none-any.whl"  # the name docs/getting-started/install.md gives
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("sparkserve/templates/launch_dflash2_tp2.sh.j2", "sparkserve/data/default.yaml",
                   "sparkserve/data/vllm-0.33.0-serve-args.json", "sparkserve/plan/_vllm_parser_worker.py",
                   "sparkserve/docker/Dockerfile", "sparkserve/docker/recipe.yaml",
                   "sparkserve/docker/recipe.lock.json", "sparkserve/docker/tools/apply_series.py",
                   "sparkserve/docker/patches/vllm/series"):
        assert needed in names, needed

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # pip installs into the temp venv (`--python`), offline, without dependencies
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # dependencies come from the test venv's site-packages via PYTHONPATH; the editable sparkserve there is a
    # .pth hook, which PYTHONPATH entries do not run, so `import sparkserve` must find the installed wheel
    deps = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
    env["PYTHONPATH"] = deps
    home = tmp_path / "elsewhere"
    home.mkdir()
    where = subprocess.run([str(py), "-c", "import sparkserve, sparkserve.plan.launcher as l; "
                            "print(sparkserve.__file__); print(l.templates_dir())"],
                           capture_output=True, text=True, env=env, cwd=home, timeout=60)
    assert where.returncode == 0, where.stderr
    pkg_file, templates = where.stdout.split()
    assert pkg_file.startswith(site) and templates == f"{site}/sparkserve/templates"

    out = home / "launch.sh"
    r = subprocess.run([str(venv / "bin" / "sparkserve"), "render", "--launcher", "-o", str(out)],
                       capture_output=True, text=True, env=env, cwd=home, timeout=60)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (REPO / "launch_dflash2_tp2.sh").read_text()
    r = subprocess.run([str(py), "-m", "sparkserve", "render", "--json"], capture_output=True, text=True,
                       env=env, cwd=home, timeout=60)
    assert r.returncode == 0 and '"--headless"' in r.stdout, r.stderr
