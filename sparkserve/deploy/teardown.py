"""Taking down what a run started: save every log first, stop (gracefully) and remove, head first.

Cleanup must finish even when the operator presses Ctrl-C again (or SIGTERM/SIGHUP arrives:
:mod:`sparkserve.interrupts`), and a failure during it must still read
as the failure that caused it: :func:`explain_failure` turns whatever ended an `up` into the one error the
operator sees, with where the saved logs are. Only containers labelled ``io.sparkserve.managed=1`` (the ids
callers pass in come from that label) are ever stopped or removed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from platformdirs import user_state_dir

from sparkserve import interrupts
from sparkserve.config import Config
from sparkserve.errors import RemoteFailure, SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.runtime import engine_for

Reporter = Callable[[str], None]


def quiet(_: str) -> None:
    """The default reporter: a library call says nothing unless asked."""
    return None


def logs_dir() -> Path:
    """Where saved container logs go (one folder per teardown): under the state dir."""
    return Path(user_state_dir("sparkserve")) / "logs"


def _new_logs_folder(tag: str) -> Path:
    """A fresh folder for one teardown's logs: under :func:`logs_dir`, or, when the state dir is unusable
    (not writable, a file where a directory should be, full), a temp dir, with one warning saying where.
    Saving logs must never stand between a failure and its cleanup."""
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{tag}"
    d = logs_dir() / name
    try:
        d.mkdir(parents=True, exist_ok=True)
        return d
    except OSError as e:
        tmp = Path(tempfile.mkdtemp(prefix=f"sparkserve-logs-{name}-"))
        print(f"warning: state dir: cannot save logs under {logs_dir()} ({e.strerror or e}); saving them to "
              f"{tmp} instead", file=sys.stderr)
        return tmp


def save_logs(nodes: dict[str, Node], containers: dict[str, list[str]], tag: str,
              cfg: Config | None = None) -> Path | None:
    """Save every listed container's (or process's: ``cfg.runtime``) full log (see :func:`_new_logs_folder`);
    never raises."""
    if not any(containers.values()):
        return None
    texts: dict[str, str] = {}
    for name, ids in containers.items():
        for cid in ids:
            with contextlib.suppress(Exception):
                texts[f"{name}-{cid[:12]}.log"] = "\n".join(engine_for(nodes[name], cfg).logs(cid)) + "\n"
    try:
        d = _new_logs_folder(tag)
    except OSError as e:  # not even a temp dir: the cleanup still runs
        print(f"warning: logs: cannot save the containers' logs anywhere ({e.strerror or e})", file=sys.stderr)
        return None
    try:
        _write_all(d, texts)
    except OSError as e:  # a full state dir takes the file names but not their bytes: never point at empty files
        for f in texts:
            with contextlib.suppress(OSError):
                (d / f).unlink()
        with contextlib.suppress(OSError):
            d.rmdir()
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f"sparkserve-logs-{d.name}-"))
            _write_all(tmp, texts)
        except OSError as e2:
            print(f"warning: logs: cannot save the containers' logs in {d} ({e.strerror or e}) nor in a temp dir "
                  f"({e2.strerror or e2})", file=sys.stderr)
            return None
        print(f"warning: state dir: cannot save logs under {d} ({e.strerror or e}); saving them to {tmp} instead",
              file=sys.stderr)
        return tmp
    return d


def _write_all(d: Path, texts: dict[str, str]) -> None:
    """Every log file in full (flushed to the file system: a full disk fails here, not silently later)."""
    for f, text in texts.items():
        with open(d / f, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())


def teardown(cfg: Config, nodes: dict[str, Node], containers: dict[str, list[str]], *, tag: str,
             say: Reporter, why: str | None = None) -> Path | None:
    """Say ``why``, save logs, then stop (gracefully) and remove the given managed containers: head first,
    so the followers are not left hanging in a collective the head will never join; return the logs
    folder. No signal (Ctrl-C, SIGTERM, SIGHUP) cuts this short."""
    with interrupts.deferred():
        if why:
            say(why)
        saved = save_logs(nodes, containers, tag, cfg)
        order = [n.name for n in cfg.nodes if containers.get(n.name)]

        def stop(name: str) -> None:
            eng = engine_for(nodes[name], cfg)
            for cid in containers[name]:
                try:
                    eng.stop_and_remove(cid, timeout=cfg.container.stop_timeout_s)
                except SparkserveError:
                    if not _daemon_back(eng, name, say):
                        raise
                    eng.stop_and_remove(cid, timeout=cfg.container.stop_timeout_s)
                finally:
                    waited = getattr(eng, "waited", {}).get(cid)  # runtime process: its stop waits for every pid
                    if waited:
                        say(f"{name}: waited for {cid}'s processes to be gone: "
                            + ", ".join(w.words() for w in waited))

        if order:
            with contextlib.suppress(SparkserveError):
                stop(order[0])
            with contextlib.suppress(SparkserveError):
                on_all(order[1:], stop)
        if saved:
            say(f"logs saved to {saved}")
        return saved


#: How long a teardown waits for a node's docker daemon that stopped answering (systemd restarts a killed dockerd
#: within seconds; with live-restore off the restarted daemon finds our container exited, and it must go too).
DAEMON_BACK_S = 30.0


def _daemon_back(eng: object, node: str, say: Reporter) -> bool:
    """Whether the node's docker daemon answers (again) within :data:`DAEMON_BACK_S`; False at once for a runtime
    with no daemon (runtime process)."""
    answers = getattr(eng, "daemon_answers", None)
    if answers is None:
        return False
    if answers():
        return True
    say(f"{node}: its docker daemon does not answer; waiting up to {DAEMON_BACK_S:.0f}s for it to come back, to "
        "remove this run's container there")
    deadline = time.monotonic() + DAEMON_BACK_S
    while time.monotonic() < deadline:
        time.sleep(1.0)
        if answers():
            return True
    return False


def interrupted(e: BaseException) -> bool:
    """Ctrl-C, SIGTERM or SIGHUP, however it surfaced: whatever failed after one arrived failed because of
    it (a KeyboardInterrupt can surface wrapped in another exception: a library that calls back into
    Python, e.g. pydantic's serializer, reports it as its own error)."""
    interrupts.note(e)
    return interrupts.stopping()


def interrupted_what() -> str:
    """``interrupted (SIGTERM)``: the start of every interrupted run's error line."""
    return f"interrupted ({interrupts.signal_name() or 'SIGINT'})"


def explain_failure(e: BaseException, saved: Path | None) -> SparkserveError:
    """The one error an `up` that cleaned up after itself reports: the cause, then where the logs are."""
    tail = [f"full logs: {saved}"] if saved else []
    if interrupted(e):
        return RemoteFailure("up", f"{interrupted_what()}; every container this run started was stopped and "
                             "removed", step="interrupted", details=tail)
    if isinstance(e, SparkserveError):
        e.details = list(e.details) + tail
        return e
    return RemoteFailure("up", f"{type(e).__name__}: {e}", details=tail)
