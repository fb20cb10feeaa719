"""vLLM's router (``vllm-router`` 0.1.17) as a process on this control machine, and its management routes.

Example::

    exe = router_executable(cfg.router.executable)     # BadInput (exit 2) when missing or the wrong package
    proc = start_router(argv, port=cfg.router.port)     # its own session; pid + start time in the state dir
    api = RouterAPI("http://127.0.0.1:30000")
    api.remove_worker(url); api.add_worker(url)         # add blocks until the worker's /health answers
    stop_router(cfg.router.port)                        # SIGTERM to its group, SIGKILL after 10 s

The router's state file (``<state dir>/router/<port>.json``: pid, the kernel's start time of that pid, argv)
is how `down`, `status` and the rolling swap find it again; a pid whose start time differs is another process
and is never signalled. Its log is ``<state dir>/router/<port>.log``. Facts: docs/replicas-facts.md §1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from platformdirs import user_state_dir

from sparkserve.errors import BadInput, RemoteFailure

#: Flags only vllm-project/router's launcher has (production-stack also ships a `vllm-router` script).
REQUIRED_FLAGS = ("--worker-urls", "--retry-max-retries", "--cb-failure-threshold")
#: The one version sparkserve runs. PyPI's newest is 0.1.17 (2026-11-04); PrimeIntellect-ai/router publishes a
#: same-named `vllm-router` 0.2.6-0.2.8 from its own index with other flags (prime-rl, 2026-11-22), which a
#: resolver reading that index would prefer (docs/card-now-2026-12.md §4).
ROUTER_VERSION = "0.1.17"
PIN = f"pip install 'vllm-router=={ROUTER_VERSION}' --index-url https://pypi.org/simple"
_VERSION_PY = "import importlib.metadata as m; print(m.version('vllm-router'))"


def router_version(exe: str) -> str | None:
    """The `vllm-router` distribution version behind launcher ``exe`` (the launcher has no --version): asked of
    the Python its console script names in its first line; None when it is not such a script or that Python has
    no `vllm-router` distribution."""
    try:
        with open(exe, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    interp = first[2:].decode(errors="replace").split()
    if not interp or "python" not in Path(interp[0]).name:
        return None
    try:
        out = subprocess.run([*interp, "-c", _VERSION_PY], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    v = out.stdout.strip()
    return v if out.returncode == 0 and v else None


def state_dir() -> Path:
    return Path(os.environ.get("SSROUTER_STATE") or Path(user_state_dir("sparkserve")) / "router")


def router_executable(name: str) -> str:
    """The launcher's path: ``name`` as a path, else next to this Python (the venv sparkserve runs in), else on
    PATH. BadInput (exit 2, nothing touched) when missing, when it is another package's `vllm-router`, or when its
    version is not 0.1.17 (the version found is named, with the pin to install)."""
    cand: str | None
    if "/" in name:
        cand = name if os.access(name, os.X_OK) else None
    else:
        here = Path(sys.executable).parent / name
        cand = str(here) if os.access(here, os.X_OK) else shutil.which(name)
    if cand is None:
        raise BadInput("router.executable", f"{name} not found here (next to {sys.executable} or on PATH): "
                       f"{PIN} (sparkserve's `replicas` extra)")
    try:
        out = subprocess.run([cand, "--help"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput("router.executable", f"{cand} --help did not run: {e}") from None
    missing = [f for f in REQUIRED_FLAGS if f not in out.stdout]
    if missing:
        raise BadInput("router.executable", f"{cand} is not vllm-project/router's launcher (its --help lacks "
                       f"{', '.join(missing)}; production-stack ships a `vllm-router` too): {PIN}")
    version = router_version(cand)
    if version != ROUTER_VERSION:
        found = f"vllm-router {version}" if version else "no vllm-router version (not a Python console script of " \
            "the vllm-router distribution)"
        fork = " (0.2.x is PrimeIntellect-ai/router's fork of the same name, with other flags)" if (
            version or "").startswith("0.2.") else ""
        raise BadInput("router.executable", f"{cand}: found {found}{fork}; sparkserve runs vllm-project/router "
                       f"{ROUTER_VERSION} only: {PIN}")
    return cand


@dataclass(frozen=True)
class RouterProcess:
    """A router this machine started: its pid, that pid's start time (clock ticks since boot), argv, log."""

    pid: int
    start_ticks: int
    port: int
    argv: list[str]
    log: str
    started_at: float

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "alive": self.alive()}


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces); None when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    if rest[0] == "Z":
        return None
    return int(rest[19])


def _state_file(port: int) -> Path:
    return state_dir() / f"{port}.json"


def recorded(port: int) -> RouterProcess | None:
    """The router this machine started on ``port`` and recorded, when its state file is there (alive or not)."""
    try:
        d = json.loads(_state_file(port).read_text())
        return RouterProcess(int(d["pid"]), int(d["start_ticks"]), int(d["port"]), list(d["argv"]), str(d["log"]),
                             float(d["started_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running(port: int) -> RouterProcess | None:
    p = recorded(port)
    return p if p is not None and p.alive() else None


def start_router(argv: list[str], *, port: int, url: str, timeout_s: float = 90.0) -> RouterProcess:
    """Start the router in its own session (a Ctrl-C at the terminal does not reach it), record it, and wait until
    ``url``/liveness answers. RemoteFailure (step "router") quoting its log when it exits or never answers (it
    is then stopped: nothing is left behind)."""
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    log = d / f"{port}.log"
    with open(log, "ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} sparkserve starts: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    ticks = _start_ticks(proc.pid)
    rp = RouterProcess(proc.pid, ticks or 0, port, argv, str(log), time.time())
    tmp = _state_file(port).with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(rp)))
    tmp.replace(_state_file(port))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _forget(port)
            raise RemoteFailure("router", f"vllm-router exited ({proc.returncode}) at start: {_last_line(log)}",
                                step="router", details=_tail(log))
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/liveness", timeout=2.0).status_code == 200:
                return rp
        time.sleep(0.2)
    stop_router(port)
    raise RemoteFailure("router", f"vllm-router did not answer {url}/liveness within {timeout_s:g}s (it was stopped)",
                        step="router", details=_tail(log))


def stop_router(port: int, *, grace_s: float = 10.0) -> RouterProcess | None:
    """SIGTERM to the recorded router's process group (it logs a graceful shutdown), SIGKILL after ``grace_s``;
    the record is removed. Returns what was stopped (None: nothing recorded alive)."""
    rp = recorded(port)
    if rp is None:
        return None
    if rp.alive():
        _signal(rp, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while rp.alive() and time.monotonic() < deadline:
            _reap(rp.pid)
            time.sleep(0.1)
        if rp.alive():
            _signal(rp, signal.SIGKILL)
            while rp.alive() and time.monotonic() < deadline + 5:
                _reap(rp.pid)
                time.sleep(0.05)
    _reap(rp.pid)
    _forget(port)
    return rp


def _signal(rp: RouterProcess, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if _start_ticks(rp.pid) == rp.start_ticks:
            os.killpg(rp.pid, sig)  # its own session: pgid == pid


def _reap(pid: int) -> None:
    """A child of this process (started by this run) is reaped so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _forget(port: int) -> None:
    with contextlib.suppress(OSError):
        _state_file(port).unlink()


def _tail(log: Path, n: int = 8) -> list[str]:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [x[:240] for x in lines[-n:]]


def _last_line(log: Path) -> str:
    tail = [x for x in _tail(log, 20) if x.strip()]
    return tail[-1] if tail else "(no output)"


class RouterAPI:
    """The router's management routes (0.1.17): /workers, /add_worker, /remove_worker, /readiness. Each failure
    is a RemoteFailure at step "router" naming the route."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, *, timeout: float, params: dict[str, str] | None = None) -> httpx.Response:
        try:
            with httpx.Client(trust_env=False, timeout=timeout) as c:
                return c.request(method, self.url + path, params=params)
        except httpx.HTTPError as e:
            raise RemoteFailure("router", f"{method} {path}: {type(e).__name__}: {e or 'no answer'}",
                                step="router") from None

    def workers(self) -> list[dict[str, Any]]:
        """Each registered worker: url, is_healthy (health checks only, not the breaker), load."""
        r = self._call("GET", "/workers", timeout=10.0)
        if r.status_code != 200:
            raise RemoteFailure("router", f"GET /workers: HTTP {r.status_code}", step="router")
        return [w for w in r.json().get("workers", []) if isinstance(w, dict)]

    def urls(self) -> list[str]:
        return [str(w.get("url")) for w in self.workers()]

    def add_worker(self, url: str, *, timeout: float = 120.0) -> None:
        """Blocks until the worker's /health answers (the router's --worker-startup-timeout-secs)."""
        r = self._call("POST", "/add_worker", params={"url": url}, timeout=timeout)
        if r.status_code != 200 and "already exists" not in r.text:
            raise RemoteFailure("router", f"POST /add_worker {url}: HTTP {r.status_code} {r.text[:200]}",
                                step="router")

    def remove_worker(self, url: str) -> None:
        """Immediate: new requests stop going there; requests in flight on it run to completion."""
        r = self._call("POST", "/remove_worker", params={"url": url}, timeout=10.0)
        if r.status_code != 200:
            raise RemoteFailure("router", f"POST /remove_worker {url}: HTTP {r.status_code} {r.text[:200]}",
                                step="router")

    def ready(self) -> bool:
        with contextlib.suppress(RemoteFailure):
            return self._call("GET", "/readiness", timeout=5.0).status_code == 200
        return False
