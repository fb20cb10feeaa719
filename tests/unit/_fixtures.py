"""Shared helpers for the foundation's unit tests: tiny model dirs, configs, the real CLI, launcher shims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "helpers"))

from tiny_models import (  # noqa: E402
    DEFAULT_MASK_TOKEN_ID,
    DrafterSpec,
    TargetSpec,
    write_drafter,
    write_mask_embedding,
    write_speculators_drafter,
    write_target,
)

from sparkserve.config import default_yaml_text  # noqa: E402

__all__ = [
    "DEFAULT_MASK_TOKEN_ID", "DrafterSpec", "TargetSpec", "write_drafter", "write_mask_embedding",
    "write_speculators_drafter", "write_target", "REPO", "clean_env", "cli", "config_file", "default_data",
    "install_shims", "read_shim_log",
]


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment a user would have: no SPARKSERVE_* leaking in, a private cache and HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_") and k != "VLLM_API_KEY"}
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), SPARKSERVE_CACHE_DIR=str(tmp / "cache"), COLUMNS="200", PYTHONPATH=str(REPO),
               NO_COLOR="1")
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 120,
        ) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (`python -m sparkserve`) as a user would."""
    return subprocess.run([sys.executable, "-m", "sparkserve", *args], capture_output=True, text=True,
                          env=env, cwd=str(cwd or env["HOME"]), timeout=timeout)


def default_data() -> dict[str, Any]:
    return yaml.safe_load(default_yaml_text())


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def config_file(path: Path, over: dict[str, Any] | None = None, *, drop: list[str] | None = None) -> Path:
    """The embedded default with ``over`` deep-merged in (and dotted keys in ``drop`` removed), as YAML."""
    data = _merge(default_data(), over or {})
    for dotted in drop or []:
        *parents, last = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        node.pop(last)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- fake `ssh` and `docker` for running the launcher -----------------------------------------------------

_DOCKER = r'''#!/usr/bin/env python3
import json, os, sys
log = os.environ["SHIM_LOG"]
host = os.environ.get("SHIM_HOST", "local")
argv = sys.argv[1:]
with open(log, "a") as f:
    f.write(json.dumps({"prog": "docker", "host": host, "argv": argv,
                        "api_key_in_env": os.environ.get("VLLM_API_KEY")}) + "\n")
existing = dict(x.split("=", 1) for x in os.environ.get("SHIM_EXISTING", "").split(";") if x)
if argv[:2] == ["container", "inspect"]:
    name, fmt = argv[-1], argv[argv.index("-f") + 1]
    if "Labels" in fmt:
        if name not in existing:
            print(f"Error: No such container: {name}", file=sys.stderr)
            sys.exit(1)
        print(existing[name])
    else:
        print("false" if os.environ.get("SHIM_NOT_RUNNING") == name else "true")
elif argv[:1] == ["run"]:
    print("0123456789abcdef")
'''

_SSH = r'''#!/usr/bin/env python3
import json, os, subprocess, sys
args = sys.argv[1:]
opts = []
while args and args[0].startswith("-"):
    flag = args.pop(0)
    opts.append(flag)
    if flag in ("-o", "-p", "-i", "-l"):
        opts.append(args.pop(0))
target, command = args[0], " ".join(args[1:])
with open(os.environ["SHIM_LOG"], "a") as f:
    f.write(json.dumps({"prog": "ssh", "host": target, "opts": opts, "command": command}) + "\n")
if os.environ.get("SHIM_REMOTE_TEST_FAILS") and command.startswith("test "):
    sys.exit(1)  # the file is missing on that node
env = dict(os.environ, SHIM_HOST=target)
env.pop("VLLM_API_KEY", None)  # a remote shell does not inherit the caller's environment
sys.exit(subprocess.call(["bash", "-c", command], env=env))
'''


def install_shims(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("docker", _DOCKER), ("ssh", _SSH)):
        p = bin_dir / name
        p.write_text(text)
        p.chmod(0o755)


def read_shim_log(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
