"""The give-up budget and the backoff: bounded restarts, then down and loud."""

from __future__ import annotations

from sparkserve.operate.recovery import Budget


def test_backoff_doubles_and_is_capped() -> None:
    b = Budget(max_restarts=5, window_s=1800, backoff_s=10, backoff_max_s=35)
    waits = []
    for t in range(4):
        d = b.decide(float(t))
        waits.append(d.wait_s)
        b.note_restart(float(t))
    assert waits == [10, 20, 35, 35]


def test_the_budget_gives_up_after_max_restarts_within_the_window() -> None:
    b = Budget(max_restarts=3, window_s=1800, backoff_s=1, backoff_max_s=60)
    for t in (0.0, 100.0, 200.0):
        assert b.decide(t).action == "restart"
        b.note_restart(t)
    d = b.decide(300.0)
    assert d.action == "give_up" and "3 restart(s)" in d.why


def test_restarts_older_than_the_window_no_longer_count() -> None:
    b = Budget(max_restarts=3, window_s=1800, backoff_s=1, backoff_max_s=60)
    for t in (0.0, 10.0, 20.0):
        b.note_restart(t)
    assert b.decide(1000.0).action == "give_up"
    d = b.decide(1815.0)  # the first two fell out of the window
    assert d.action == "restart" and d.wait_s == 2


def test_a_zero_budget_never_restarts() -> None:
    assert Budget(max_restarts=0, window_s=60, backoff_s=1, backoff_max_s=1).decide(0.0).action == "give_up"
