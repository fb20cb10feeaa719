"""Run one step on every node at once; collect every node's failure, not just the first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from sparkserve import interrupts
from sparkserve.errors import RemoteFailure, SparkserveError

T = TypeVar("T")
R = TypeVar("R")


def on_all(items: Sequence[T], fn: Callable[[T], R], *, name: Callable[[T], str] = str,
           meanwhile: Callable[[], object] | None = None) -> dict[str, R]:
    """``fn(item)`` for every item in parallel. Raises the first (in item order) failure after all finish.

    Other failures are attached as details so the user sees every node that failed. ``meanwhile`` runs in
    the calling thread while the items are worked on (a command imports what it needs next while its
    nodes connect); when it raises, that is raised once every item finished.
    """
    if not items:
        if meanwhile is not None:
            meanwhile()
        return {}
    results: dict[str, R] = {}
    errors: list[tuple[str, BaseException]] = []
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        # an interrupt in the middle of submit would leave a started thread the pool does not wait for
        with interrupts.deferred(raise_after=True):
            futures = [(name(i), pool.submit(fn, i)) for i in items]
        if meanwhile is not None:
            meanwhile()
        for key, fut in futures:
            try:
                results[key] = fut.result()
            except KeyboardInterrupt:  # Ctrl-C lands in the main thread's wait: not this node's failure
                raise
            except BaseException as e:  # noqa: BLE001 - collected and re-raised below
                errors.append((key, e))
    if errors:
        key, first = errors[0]
        if not isinstance(first, SparkserveError):
            first = RemoteFailure(key, f"{type(first).__name__}: {first}", node=key)
        for other_key, other in errors[1:]:
            text = other.line() if isinstance(other, SparkserveError) else f"{type(other).__name__}: {other}"
            first.details.append(f"also failed on {other_key}: {text}")
        raise first
    return results


def after(first: Future[Any] | None, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` once ``first`` is done, however it ended (its outcome is for its own caller): two steps
    that would each open a connection to the same nodes, one after the other on one pool thread."""
    if first is not None:
        wait([first])
    return fn(*args)
