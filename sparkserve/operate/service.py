"""`sparkserve service install|uninstall|status`: a systemd unit that runs `supervise --up` for one config.

    text = unit_text(cfg, config_path, scope="user")     # the unit, as written
    install(cfg, config_path, scope="user")              # writes it, daemon-reload, enable --now
    status(scope="user")                                 # systemctl's own words

The unit is ``Type=notify`` (supervise sends READY=1 after its first round) with ``WatchdogSec`` (it sends
WATCHDOG=1 while its loop keeps time: a hung supervisor is killed and restarted), ordered after
``network-online.target`` and ``docker.service``. ``Restart=on-failure``, but not after a give-up (exit 1,
``RestartPreventExitStatus``): a stack that spent its restart budget stays down until a person looks —
an unbounded loop is worse than down (eugr/spark-vllm-docker#257). A user unit survives reboots only with
``loginctl enable-linger``; `install` says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sparkserve.config import Config
from sparkserve.errors import BadInput, RemoteFailure

Scope = Literal["user", "system"]
UNIT = "sparkserve-supervise.service"


def unit_dir(scope: Scope) -> Path:
    if scope == "system":
        return Path("/etc/systemd/system")
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "systemd" / "user"


def quote(arg: str) -> str:
    """One ExecStart word as systemd reads it (systemd.syntax(7)): double-quoted, ``\\`` and ``"`` escaped,
    ``%`` as ``%%`` (specifiers) and ``$`` as ``$$`` (variable expansion)."""
    if any(c in arg for c in "\n\r\0"):
        raise BadInput("service", f"{arg!r} contains a control character")
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"'


def unit_text(cfg: Config, config_path: Path, *, scope: Scope, python: str | None = None) -> str:
    s = cfg.supervise
    argv = [python or sys.executable, "-m", "sparkserve", "supervise", "--up", "-c", str(config_path.resolve())]
    watchdog = int(max(60.0, 6 * s.interval_s + 2 * s.canary_deadline_s))
    start = int(cfg.serve.ready_timeout_s + 600)  # READY=1 comes after `up` and a first round
    env = []
    if os.environ.get("XDG_STATE_HOME"):
        env.append(f"Environment={quote('XDG_STATE_HOME=' + os.environ['XDG_STATE_HOME'])}")
    lines = [
        "# written by `sparkserve service install`; `sparkserve service uninstall` removes it",
        "[Unit]",
        f"Description=sparkserve supervise: keep {cfg.model.served_name} serving ({config_path.resolve()})",
        "Wants=network-online.target",
        "After=network-online.target docker.service",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        "ExecStart=" + " ".join(quote(a) for a in argv),
        *env,
        "Restart=on-failure",
        "RestartSec=30",
        "# exit 1: gave up after the restart budget (or a check failed at start); 2: bad config — stay down",
        "RestartPreventExitStatus=1 2",
        f"WatchdogSec={watchdog}",
        f"TimeoutStartSec={start}",
        "TimeoutStopSec=90",
        "KillMode=mixed",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if scope == 'system' else 'default.target'}",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class ServiceResult:
    path: Path
    systemctl: list[str]
    note: str = ""


def _systemctl(scope: Scope, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemctl")
    if exe is None:
        raise RemoteFailure("systemctl", "not found: this machine does not run systemd (the unit file is written; "
                            "start `sparkserve supervise --up` another way)")
    argv = [exe, *(["--user"] if scope == "user" else []), *args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise RemoteFailure("systemctl", f"{' '.join(argv[1:])}: {(p.stderr or p.stdout).strip()[:300]}")
    return p


def install(cfg: Config, config_path: Path, *, scope: Scope, start: bool = True, dest: Path | None = None,
            run_systemctl: bool = True) -> ServiceResult:
    d = dest or unit_dir(scope)
    d.mkdir(parents=True, exist_ok=True)
    path = d / UNIT
    tmp = path.with_name(f".{UNIT}.{os.getpid()}")
    tmp.write_text(unit_text(cfg, config_path, scope=scope))
    os.replace(tmp, path)
    done: list[str] = []
    if run_systemctl:
        _systemctl(scope, "daemon-reload")
        _systemctl(scope, "enable", *(["--now"] if start else []), UNIT)
        done = ["daemon-reload", f"enable{' --now' if start else ''} {UNIT}"]
    note = ("a user unit runs at boot only with lingering on: `sudo loginctl enable-linger $USER`"
            if scope == "user" else "")
    return ServiceResult(path, done, note)


def uninstall(*, scope: Scope, dest: Path | None = None, run_systemctl: bool = True) -> ServiceResult:
    path = (dest or unit_dir(scope)) / UNIT
    done: list[str] = []
    if run_systemctl and path.exists():
        _systemctl(scope, "disable", "--now", UNIT, check=False)
        done.append(f"disable --now {UNIT}")
    path.unlink(missing_ok=True)
    if run_systemctl:
        _systemctl(scope, "daemon-reload", check=False)
        done.append("daemon-reload")
    return ServiceResult(path, done)


def status(*, scope: Scope, dest: Path | None = None) -> tuple[bool, str]:
    """(installed, what systemctl says — or that there is no systemd here)."""
    path = (dest or unit_dir(scope)) / UNIT
    if not path.exists():
        return False, f"not installed ({path} does not exist)"
    if dest is not None:
        return True, f"installed at {path} (a directory of your own: systemd was not asked)"
    if shutil.which("systemctl") is None:
        return True, f"installed at {path}; no systemctl on this machine"
    p = _systemctl(scope, "status", "--no-pager", "--lines=5", UNIT, check=False)
    return True, f"installed at {path}\n" + (p.stdout or p.stderr).strip()
