"""A6 (issue 26), on the two-node rig: the head's worker fails NCCL init at boot (the emulator's
`crash_boot@rank=0`: `RuntimeError: NCCL error: unhandled system error`, as real vLLM prints it); the healthy
follower then logs c10d `recvValue failed … Did the remote server shutdown or crash?`. `up` must blame the head
and quote its own cause, in every run — it blamed the follower in 3 of 3 runs before."""

from __future__ import annotations

import pytest
from e2e_support import BOTH_RUNTIMES

pytestmark = pytest.mark.rig


@BOTH_RUNTIMES
@pytest.mark.parametrize("run", range(3))
def test_head_crash_at_boot_quotes_the_heads_cause_never_the_follower(e2e, run: int) -> None:
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "crash_boot@rank=0"}}})
    p = e2e.cli("up", cfg=cfg)
    text = e2e.assert_explained(p, code=3, node="node-a", step="boot",
                                says=("rank 0", "RuntimeError: NCCL error: unhandled system error"))
    first = text.splitlines()[0]
    assert "node-b" not in first and "recvValue" not in first, first
    assert "NCCL error: unhandled system error" in first, first  # the headline itself names the cause
    assert e2e.leftovers() == {}, "containers left behind"
