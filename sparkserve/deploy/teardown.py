"""Taking down what a run started: save every log first, stop (gracefully) and remove, head first.

Cleanup must finish even when the operator presses Ctrl-C again, and a failure during it must still read
as the failure that caused it: :func:`explain_failure` turns whatever ended an `up` into the one error the
operator sees, with where the saved logs are. Only containers labelled ``io.sparkserve.managed=1`` (the ids
callers pass in come from that label) are ever stopped or removed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from platformdirs import user_state_dir

from sparkserve.config import Config
from sparkserve.errors import RemoteFailure, SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import Engine
from sparkserve.nodes.parallel import on_all

Reporter = Callable[[str], None]


def quiet(_: str) -> None:
    """The default reporter: a library call says nothing unless asked."""
    return None


def logs_dir() -> Path:
    """Where saved container logs go (one folder per teardown)."""
    d = Path(user_state_dir("sparkserve")) / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def save_logs(nodes: dict[str, Node], containers: dict[str, list[str]], tag: str) -> Path | None:
    """Save every listed container's full log under the state dir; never raises."""
    if not any(containers.values()):
        return None
    d = logs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-{tag}"
    d.mkdir(parents=True, exist_ok=True)
    for name, ids in containers.items():
        for cid in ids:
            with contextlib.suppress(Exception):
                text = "\n".join(Engine(nodes[name]).logs(cid)) + "\n"
                (d / f"{name}-{cid[:12]}.log").write_text(text)
    return d


def teardown(cfg: Config, nodes: dict[str, Node], containers: dict[str, list[str]], *, tag: str,
             say: Reporter, why: str | None = None) -> Path | None:
    """Say ``why``, save logs, then stop (gracefully) and remove the given managed containers: head first,
    so the followers are not left hanging in a collective the head will never join; return the logs
    folder. A second Ctrl-C cannot cut this short."""
    with sigint_deferred():
        if why:
            say(why)
        saved = save_logs(nodes, containers, tag)
        order = [n.name for n in cfg.nodes if containers.get(n.name)]

        def stop(name: str) -> None:
            eng = Engine(nodes[name])
            for cid in containers[name]:
                eng.stop_and_remove(cid, timeout=cfg.container.stop_timeout_s)

        if order:
            with contextlib.suppress(SparkserveError):
                stop(order[0])
            with contextlib.suppress(SparkserveError):
                on_all(order[1:], stop)
        if saved:
            say(f"logs saved to {saved}")
        return saved


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Cleanup must finish: a second Ctrl-C while tearing down is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


# Set when Ctrl-C arrived during `up`: a KeyboardInterrupt can surface wrapped in another exception (a
# library that calls back into Python, e.g. pydantic's serializer, reports it as its own error).
_ctrl_c = threading.Event()


@contextlib.contextmanager
def watch_ctrl_c() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as usual, and is remembered (see :func:`interrupted`)."""
    _ctrl_c.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        _ctrl_c.set()
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def interrupted(e: BaseException) -> bool:
    """Ctrl-C, however it surfaced: whatever failed after it was pressed failed because of it."""
    return isinstance(e, KeyboardInterrupt) or _ctrl_c.is_set()


def explain_failure(e: BaseException, saved: Path | None) -> SparkserveError:
    """The one error an `up` that cleaned up after itself reports: the cause, then where the logs are."""
    tail = [f"full logs: {saved}"] if saved else []
    if interrupted(e):
        return RemoteFailure("up", "interrupted; every container this run started was stopped and removed",
                             step="interrupted", details=tail)
    if isinstance(e, SparkserveError):
        e.details = list(e.details) + tail
        return e
    return RemoteFailure("up", f"{type(e).__name__}: {e}", details=tail)
