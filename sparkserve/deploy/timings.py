"""Where a command's time goes: named spans, collected from any thread, printed by `up --timings`.

    with span("preflight"):
        ...
    f = pool.submit(timed("preflight: engine", ensure_same_engine), cfg, nodes)
    print(report())        # one line per span, slowest first, with its share of the wall time

One process runs one `up`, so the spans are module state; :func:`reset` starts a new collection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_spans: list[tuple[str, float, float]] = []  # (name, start offset, seconds)
_open: dict[int, tuple[str, float]] = {}  # the spans under way: a token -> (name, monotonic start)
_next = 0
_t0 = time.monotonic()


def reset() -> None:
    global _t0
    with _lock:
        _spans.clear()
        _t0 = time.monotonic()


@contextmanager
def span(name: str) -> Iterator[None]:
    global _next
    t = time.monotonic()
    with _lock:
        _next += 1
        token = _next
        _open[token] = (name, t)
    try:
        yield
    finally:
        with _lock:
            _open.pop(token, None)
            _spans.append((name, t - _t0, time.monotonic() - t))


def under_way() -> list[tuple[str, float]]:
    """The innermost spans under way now (a span is left out while another under way is inside it, by name:
    "preflight" while "preflight: engine identity" runs), each with its monotonic start, oldest first: what a
    progress line names as the step in progress."""
    with _lock:
        now = sorted(_open.values(), key=lambda x: x[1])
    names = [n for n, _ in now]
    return [(n, t) for n, t in now if not any(o != n and o.startswith(n + ":") for o in names)]


def timed(name: str, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` wrapped in a span (for a thread pool's submit)."""
    def run(*args: Any, **kwargs: Any) -> T:
        with span(name):
            return fn(*args, **kwargs)
    return run


def spans() -> list[dict[str, Any]]:
    with _lock:
        return [{"span": n, "start_s": round(s, 3), "seconds": round(d, 3)} for n, s, d in _spans]


def report() -> str:
    """The spans in start order: start offset, seconds, name (spans of one parallel step overlap)."""
    wall = time.monotonic() - _t0
    with _lock:
        rows = sorted(_spans, key=lambda r: r[1])
    lines = [f"timings: {wall:.2f}s in all (spans that start together ran side by side)"]
    lines += [f"  +{start:6.2f}s {took:7.2f}s  {name}" for name, start, took in rows]
    return "\n".join(lines)
