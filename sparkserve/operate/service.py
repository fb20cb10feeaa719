"""`sparkserve service install|uninstall|status`: a systemd unit that runs `supervise --up` for one config.

    text = unit_text(cfg, config_path, scope="system")   # the unit, as written
    install(cfg, config_path, scope="system")            # writes it, daemon-reload, enable --now
    status(scope="user")                                 # systemctl's own words, and lingering

The unit is ``Type=notify`` (supervise sends READY=1 after its first round) with ``WatchdogSec`` (it sends
WATCHDOG=1 while its loop keeps time: a hung supervisor is killed and restarted). ``Restart=on-failure``, but
not after a give-up (exit 1, ``RestartPreventExitStatus``): a stack that spent its restart budget stays down
until a person looks — an unbounded loop is worse than down (eugr/spark-vllm-docker#257).

"The stack comes back after a reboot" is true in either scope, each its own way:

* ``system`` (``/etc/systemd/system``, needs root): the unit runs as the user who installs it (``User=``, the
  ``sudo`` caller), ordered after ``network-online.target`` and ``docker.service`` — system units both.
* ``user`` (``~/.config/systemd/user``): a user manager ignores those two (they are system units; systemd#3312),
  so the unit waits itself: ``ExecStartPre`` runs ``sparkserve service wait`` (every node's SSH port answers, and
  on a ``local: true`` node docker's API), and it starts at boot only with lingering on — `install` turns it on
  (``loginctl enable-linger``) or says it could not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
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


def service_user() -> str:
    """Who a system unit runs as: the user behind ``sudo``, else this process's user."""
    import getpass

    return os.environ.get("SUDO_USER") or getpass.getuser()


def unit_text(cfg: Config, config_path: Path, *, scope: Scope, python: str | None = None,
              user: str | None = None) -> str:
    s = cfg.supervise
    exe = python or sys.executable
    conf = str(config_path.resolve())
    argv = [exe, "-m", "sparkserve", "supervise", "--up", "-c", conf]
    watchdog = int(max(60.0, 6 * s.interval_s + 2 * s.canary_deadline_s))
    start = int(cfg.serve.ready_timeout_s + 600)  # READY=1 comes after `up` and a first round
    env = []
    if os.environ.get("XDG_STATE_HOME"):
        env.append(f"Environment={quote('XDG_STATE_HOME=' + os.environ['XDG_STATE_HOME'])}")
    if scope == "system":
        order = ["Wants=network-online.target", "After=network-online.target docker.service"]
        who = [f"User={user or service_user()}"]  # systemd sets HOME, USER, LOGNAME from it
    else:  # a user manager ignores ordering on system units: the unit waits for the nodes itself
        order, who = [], []
        wait = [exe, "-m", "sparkserve", "service", "wait", "-c", conf, "--timeout", str(WAIT_S)]
        who.append("ExecStartPre=" + " ".join(quote(a) for a in wait))
    lines = [
        "# written by `sparkserve service install`; `sparkserve service uninstall` removes it",
        "[Unit]",
        f"Description=sparkserve supervise: keep {cfg.model.served_name} serving ({config_path.resolve()})",
        *order,
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        *who,
        "ExecStart=" + " ".join(quote(a) for a in argv),
        *env,
        "Restart=on-failure",
        "RestartSec=30",
        "# exit 1: gave up after the restart budget (or a check failed at start); 2: bad config — stay down",
        "RestartPreventExitStatus=1 2",
        f"WatchdogSec={watchdog}",
        f"TimeoutStartSec={start + (WAIT_S if scope == 'user' else 0)}",
        "TimeoutStopSec=90",
        "KillMode=mixed",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if scope == 'system' else 'default.target'}",
    ]
    return "\n".join(lines) + "\n"


#: How long a user unit's ExecStartPre waits for the nodes after a boot before the start fails (and is retried).
WAIT_S = 600


def node_endpoints(cfg: Config) -> list[tuple[str, str]]:
    """What must answer before `supervise --up` can work: ``(node, "host:port")`` for each SSH node (its ProxyJump
    host when it has one), ``(node, "docker")`` for a local node of runtime docker."""
    from sparkserve.nodes.ssh_resolve import resolve

    out: list[tuple[str, str]] = []
    for n in cfg.nodes:
        if n.local:
            if cfg.runtime == "docker":
                out.append((n.name, "docker"))
            continue
        r = resolve(n, cfg.ssh)
        hop = r.proxy_jump.split(",")[0].rsplit("@", 1)[-1] if r.proxy_jump else None
        host, port = (hop.rsplit(":", 1)[0], int(hop.rsplit(":", 1)[1])) if hop and ":" in hop else (
            (hop, 22) if hop else (r.hostname, r.port))
        out.append((n.name, f"{host}:{port}"))
    return out


def _answers(endpoint: str, timeout: float) -> bool:
    """Whether a TCP ``host:port`` accepts a connection, or (``docker``) the local docker API answers ``/_ping``."""
    import socket

    try:
        if endpoint == "docker":
            where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            if not where.startswith("unix://"):
                return _answers(where.split("://", 1)[-1].rstrip("/"), timeout)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(where.removeprefix("unix://"))
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                return b" 200 " in sock.recv(64).split(b"\r\n", 1)[0] + b" "
        host, port = endpoint.rsplit(":", 1)
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def wait_for_nodes(cfg: Config, *, timeout_s: float, interval_s: float = 2.0,
                   say: Callable[[str], None] = lambda _m: None) -> float:
    """Block until every endpoint of :func:`node_endpoints` answers (seconds waited); RemoteFailure naming the
    ones that never did once ``timeout_s`` has passed."""
    import time

    t0 = time.monotonic()
    left, said = node_endpoints(cfg), None
    while True:
        left = [(n, e) for n, e in left if not _answers(e, min(5.0, interval_s + 3))]
        if not left:
            return time.monotonic() - t0
        if time.monotonic() - t0 >= timeout_s:
            raise RemoteFailure(left[0][0], f"{left[0][1]} did not answer within {timeout_s:g}s"
                                + "".join(f"; {n}: {e} neither" for n, e in left[1:]))
        if left != said:  # once per change, not every round (the journal of a slow boot stays short)
            say("waiting for " + ", ".join(f"{n} ({e})" for n, e in left))
            said = left
        time.sleep(interval_s)


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
    note = ""
    if run_systemctl:
        _systemctl(scope, "daemon-reload")
        _systemctl(scope, "enable", *(["--now"] if start else []), UNIT)
        done = ["daemon-reload", f"enable{' --now' if start else ''} {UNIT}"]
        if scope == "user" and not ensure_linger():
            note = (f"lingering is off for {service_user()} and could not be turned on: the unit will NOT start at "
                    "boot until `sudo loginctl enable-linger $USER` (or use --scope system)")
    elif scope == "user":
        note = "a user unit starts at boot only with lingering on: `loginctl enable-linger` (sudo for another user)"
    return ServiceResult(path, done, note)


def linger() -> bool | None:
    """Whether this user's manager runs without a login (loginctl's Linger), None when loginctl cannot tell."""
    exe = shutil.which("loginctl")
    if exe is None:
        return None
    p = subprocess.run([exe, "show-user", service_user(), "--property=Linger", "--value"], capture_output=True,
                       text=True, timeout=30)
    return p.stdout.strip() == "yes" if p.returncode == 0 else None


def ensure_linger() -> bool:
    """Lingering on for this user (logind lets a user turn on their own); False when it stays off."""
    if linger():
        return True
    exe = shutil.which("loginctl")
    if exe is None:
        return False
    subprocess.run([exe, "enable-linger", service_user()], capture_output=True, text=True, timeout=30)
    return bool(linger())


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
    boot = {True: "lingering on: starts at boot", False: "lingering OFF: does not start at boot "
            "(`loginctl enable-linger`)", None: "lingering unknown"}[linger()] if scope == "user" else "a system unit"
    return True, f"installed at {path} ({boot})\n" + (p.stdout or p.stderr).strip()
