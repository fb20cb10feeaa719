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
    "install_shims", "read_shim_log", "cli_batch",
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


_BATCH_DRIVER = r"""
import json, os, sys, traceback
from sparkserve.cli import main  # imported once; every job runs in a fresh fork of this process
jobs = json.load(sys.stdin)
# every public sparkserve module, imported here once (~0.5 s): the CLI imports its command modules and their
# dependencies lazily, so each fork would import them again (paramiko, docker, pydantic models: ~0.25 s a job).
# Private modules are left to their importers: some are programs of their own (plan/_vllm_parser_worker).
import importlib, pkgutil, sparkserve
for m in pkgutil.walk_packages(sparkserve.__path__, "sparkserve."):
    if not m.name.rsplit(".", 1)[-1].startswith("_"):
        importlib.import_module(m.name)
results = [None] * len(jobs)
running = {}  # pid -> job index: two children at a time (each its own files, cwd and environment)
for i, job in enumerate(jobs):
    while len(running) >= 2:
        done, status = os.wait()
        if done in running:
            results[running.pop(done)] = os.waitstatus_to_exitcode(status)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            for fd, path in ((1, job["out"]), (2, job["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            sys.argv = ["sparkserve", *job["args"]]
            main()
        except SystemExit as e:
            if isinstance(e.code, int) or e.code is None:
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    running[pid] = i
while running:
    done, status = os.wait()
    if done in running:
        results[running.pop(done)] = os.waitstatus_to_exitcode(status)
print(json.dumps(results))
"""


def cli_batch(jobs: list[tuple[list[str], dict[str, str]]], work: Path) -> list[subprocess.CompletedProcess[str]]:
    """Many CLI runs, each its own process (a fork of one interpreter that imported sparkserve once):
    real exit codes, real stdout/stderr, a fraction of the start-up cost."""
    work.mkdir(parents=True, exist_ok=True)
    spec = []
    for i, (args, env) in enumerate(jobs):
        spec.append({"args": args, "env": env, "cwd": env["HOME"], "out": str(work / f"{i}.out"),
                     "err": str(work / f"{i}.err")})
    driver_env = {**jobs[0][1]} if jobs else clean_env(work)
    p = subprocess.run([sys.executable, "-c", _BATCH_DRIVER], input=json.dumps(spec), capture_output=True,
                       text=True, env=driver_env, timeout=600)
    assert p.returncode == 0, p.stderr
    codes = json.loads(p.stdout)
    return [subprocess.CompletedProcess(["sparkserve", *j["args"]], code, Path(j["out"]).read_text(),
                                        Path(j["err"]).read_text()) for j, code in zip(spec, codes, strict=True)]


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
# bash, not python: the launcher tests start hundreds of them. Each call appends one record to $SHIM_LOG:
# NUL-terminated fields, then an RS (\x1e) field: prog, host, extra, argv...

_DOCKER = r"""#!/usr/bin/env bash
printf '%s\0' docker "${SHIM_HOST:-local}" "${VLLM_API_KEY-<unset>}" "$@" $'\x1e' >>"$SHIM_LOG"
if [[ "$1 $2" == "container inspect" ]]; then
  name="${!#}"
  fmt=""
  for ((i = 1; i < $#; i++)); do [[ "${!i}" == -f ]] && { j=$((i + 1)); fmt="${!j}"; }; done
  if [[ "$fmt" == *Labels* ]]; then
    IFS=';' read -ra existing <<<"${SHIM_EXISTING:-}"
    for e in "${existing[@]}"; do
      [[ "${e%%=*}" == "$name" ]] && { echo "${e#*=}"; exit 0; }
    done
    echo "Error: No such container: $name" >&2
    exit 1
  fi
  [[ "${SHIM_NOT_RUNNING:-}" == "$name" ]] && echo false || echo true
elif [[ "$1" == run ]]; then
  echo 0123456789abcdef
elif [[ "$1 $2" == "image inspect" ]]; then  # the image's ID (the launcher keys the caches by it)
  echo "sha256:${SHIM_IMAGE_ID:-feedfacecafe0123456789abcdef0123456789abcdef0123456789abcdef0123}"
fi
"""

_SSH = r"""#!/usr/bin/env bash
opts=()
while [[ "$1" == -* ]]; do
  case "$1" in -o | -p | -i | -l) opts+=("$1" "$2"); shift 2 ;; *) opts+=("$1"); shift ;; esac
done
target="$1"
shift
command="$*"
printf '%s\0' ssh "$target" "${opts[*]}" "$command" $'\x1e' >>"$SHIM_LOG"
if [[ -n "${SHIM_REMOTE_TEST_FAILS:-}" && "$command" == "test "* ]]; then exit 1; fi  # missing on that node
unset VLLM_API_KEY  # a remote shell does not inherit the caller's environment
SHIM_HOST="$target" exec bash -c "$command"
"""


def install_shims(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("docker", _DOCKER), ("ssh", _SSH)):
        p = bin_dir / name
        p.write_text(text)
        p.chmod(0o755)


def read_shim_log(log: Path) -> list[dict[str, Any]]:
    """docker records: {prog, host, api_key_in_env, argv}; ssh records: {prog, host, opts, command}."""
    if not log.exists():
        return []
    out: list[dict[str, Any]] = []
    for rec in log.read_bytes().decode().split("\x1e\0"):
        fields = rec.split("\0")[:-1]
        if not fields:
            continue
        if fields[0] == "docker":
            key = None if fields[2] == "<unset>" else fields[2]
            out.append({"prog": "docker", "host": fields[1], "api_key_in_env": key, "argv": fields[3:]})
        else:
            out.append({"prog": "ssh", "host": fields[1], "opts": fields[2].split(), "command": fields[3]})
    return out


# --- a fake /sys for fabric detection ----------------------------------------------------------------------


def write_fake_sysfs(root: Path, *, twin: bool = False) -> Path:
    """One CX-7 port holding both nodes' RoCE v2 IPv4 GIDs (both rig nodes read this machine's tree): spark-a's
    192.168.200.1 at GID 3, spark-b's 192.168.200.2 at GID 5; ``twin``: roceP2p1s0f1 with its own v2 addresses."""
    def w(rel: str, text: str) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    hcas = [("rocep1s0f1", "enp1s0f1np1", "200")] + ([("roceP2p1s0f1", "enP2p1s0f1np1", "201")] if twin else [])
    for hca, ndev, net in hcas:
        w(f"class/net/{ndev}/operstate", "up")
        w(f"class/net/{ndev}/mtu", "9000")
        w(f"class/net/{ndev}/carrier", "1")
        (root / f"class/infiniband/{hca}/device/net/{ndev}").mkdir(parents=True, exist_ok=True)
        port = f"class/infiniband/{hca}/ports/1"
        w(f"{port}/state", "4: ACTIVE")
        w(f"{port}/phys_state", "5: LinkUp")
        w(f"{port}/link_layer", "Ethernet")
        w(f"{port}/rate", "200 Gb/sec (4X HDR)")
        for idx, gid, kind in ((0, "fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
                               (3, f"0000:0000:0000:0000:0000:ffff:c0a8:{int(net):02x}01", "RoCE v2"),
                               (5, f"0000:0000:0000:0000:0000:ffff:c0a8:{int(net):02x}02", "RoCE v2")):
            w(f"{port}/gids/{idx}", gid)
            w(f"{port}/gid_attrs/types/{idx}", kind)
            w(f"{port}/gid_attrs/ndevs/{idx}", ndev)
    return root
