"""Ctrl-C, SIGTERM and SIGHUP: each means "stop now, clean up, say so", and cleanup is never cut short.

    install()                  # the CLI entry point: the three signals raise Interrupted from then on
    with watching(): ...       # a library call (`up` in-process): the same for the block, state cleared first
    with deferred(): ...       # cleanup: a signal that arrives now is remembered, it does not raise
    run_async(main, *args)     # asyncio.run(main(*args)) that a signal never leaves half-made
    if stopping(): ...         # a worker thread's transfer loop: an interrupt arrived, stop and clean up

The first of these signals raises :class:`Interrupted` (a KeyboardInterrupt, so every ``except
KeyboardInterrupt`` treats SIGTERM like Ctrl-C) in the main thread and sets the stop flag. Threads of an
executor cannot be cancelled, so long copies check :func:`stopping` and end themselves. Every later signal
is only remembered: what runs after the first one is cleanup (teardown, the head lock), and it must finish.
A CI timeout, systemd and a dropped SSH session (SIGHUP) thereby clean up exactly as Ctrl-C does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

#: How long the tasks an interrupt left behind get to finish their cancellation (close their connections).
CANCEL_GRACE_S = 5.0

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_stop = threading.Event()  # an interrupt arrived (worker threads poll it)
_state: dict[str, object] = {"signum": None, "deferring": 0, "raised": False}


class Interrupted(KeyboardInterrupt):
    """The run was interrupted by ``signum`` (SIGINT, SIGTERM or SIGHUP)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state["signum"] is None:
        _state["signum"] = signum
    _stop.set()
    if not _state["raised"] and not _state["deferring"]:
        _state["raised"] = True
        raise Interrupted(signum)
    # a second signal, or one during cleanup: remembered above; the cleanup in progress must finish


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """From now on SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (once) in the main thread."""
    if _in_main_thread():
        for s in HANDLED:
            signal.signal(s, _handler)


def reset() -> None:
    """Forget an earlier interrupt (a new run in the same process starts clean)."""
    _stop.clear()
    _state["signum"] = None
    _state["raised"] = False


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """The three signals interrupt the block (see :func:`install`); the previous handlers come back after.
    An interrupt seen in the block stays remembered after it, so the caller can still explain it.

    An interrupt that arrived before the block and was only remembered (it came during cleanup, inside
    :func:`deferred`) is raised here, not forgotten: an `ab run` that boots drafter after drafter must stop when
    Ctrl-C lands while the previous stack is being stopped. Only an interrupt already raised is cleared."""
    signum = _state["signum"]
    if isinstance(signum, int) and not _state["raised"] and not _state["deferring"] and _in_main_thread():
        _state["raised"] = True
        raise Interrupted(signum)
    reset()
    if not _in_main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in HANDLED}
    install()
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred(*, raise_after: bool = False) -> Iterator[None]:
    """Cleanup must finish: a signal arriving inside the block is remembered (:func:`stopping`) but raises
    nothing there. ``raise_after``: for a step that must not be cut in half (handing work to threads, which
    an exception in the middle would leave running unwatched), the interrupt is raised once the block ends."""
    _state["deferring"] = int(_state["deferring"]) + 1  # type: ignore[call-overload]
    try:
        yield
    finally:
        _state["deferring"] = int(_state["deferring"]) - 1  # type: ignore[call-overload]
    signum = _state["signum"]
    if raise_after and isinstance(signum, int) and not _state["raised"] and not _state["deferring"]:
        _state["raised"] = True
        raise Interrupted(signum)


def note(e: BaseException) -> None:
    """Remember a KeyboardInterrupt that did not come through our handler (Python's default SIGINT one)."""
    if isinstance(e, KeyboardInterrupt) and _state["signum"] is None:
        _state["signum"] = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        _state["raised"] = True
        _stop.set()


def raise_in_worker() -> None:
    """In a worker thread (a replica's boot, a fleet's restart), raise :class:`Interrupted` once an interrupt
    arrived, so its long wait ends as the main thread's does (the signal itself interrupts only the main thread,
    which then waits for its workers); in the main thread, nothing."""
    signum = _state["signum"]
    if _stop.is_set() and not _in_main_thread():
        raise Interrupted(signum if isinstance(signum, int) else signal.SIGINT)


def stopping() -> bool:
    """An interrupt arrived: a transfer in progress stops and removes what it left half-written."""
    return _stop.is_set()


def signal_name() -> str | None:
    """``SIGTERM`` (etc.) when an interrupt arrived, else None."""
    signum = _state["signum"]
    return signal.Signals(signum).name if isinstance(signum, int) else None


def run_async(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kw: Any) -> T:
    """``asyncio.run(fn(*args, **kw))`` where the first signal may land at any moment (:func:`install` is in force).

    asyncio.run leaves a window open: a signal that raises while its loop is being made (``Runner._lazy_init``)
    or before its task wraps the coroutine leaves an unclosed loop and a coroutine never awaited, which the
    garbage collector reports later, with a traceback, after the one-line error (issue 29: Ctrl-C during the
    gates). Here the loop is made, the coroutine created and wrapped in its task, and everything torn down
    inside :func:`deferred` blocks, so a signal is raised only while the task runs, or just after a step;
    the tasks it interrupts are cancelled and given :data:`CANCEL_GRACE_S` to close their connections."""
    with deferred():
        loop = asyncio.new_event_loop()
    try:
        with deferred(raise_after=True):
            coro = fn(*args, **kw)
            task = loop.create_task(coro)
        return loop.run_until_complete(task)
    finally:
        with deferred():
            _close(loop)


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is still pending, let it finish within :data:`CANCEL_GRACE_S`, close the loop."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_GRACE_S))
        for t in pending:  # retrieve each outcome: no "exception was never retrieved" at collection
            if t.done() and not t.cancelled():
                t.exception()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
