"""``pool`` — ``KV cache size: N tokens`` equals the banked pool for this config fingerprint and
``gates.pool_tokens`` when set (with neither, the observed pool passes and is what ``--bank`` records)."""

from __future__ import annotations

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Verdict
from sparkserve.observe.gates.evidence import ev, nodes_text
from sparkserve.observe.logpatterns import Kind


def pool_gate(an: Analysis, ex: Expectations) -> Verdict:
    lines = an.events(Kind.KV_TOKENS)
    observed = list(an.kv_cache_tokens)
    expected = {"config": ex.pool_tokens, "banked": ex.banked_pool}
    evidence = [ev(log, e) for log, e in lines]
    if not observed:
        blocks = an.events(Kind.GPU_BLOCKS)
        extra = " (only V0 `# GPU blocks` lines, which are blocks, not tokens)" if blocks else ""
        if an.failed_boot_kv_cache_tokens:
            extra = (" (the pool line of " + ", ".join(f"{n:,}" for n in an.failed_boot_kv_cache_tokens)
                     + " tokens belongs to a boot that failed after printing it)")
        return Verdict(
            "pool",
            False,
            expected,
            None,
            f"looked for `KV cache size: N tokens` (EngineCore, head) in {nodes_text(an)}: not found{extra}",
            [ev(log, e) for log, e in blocks],
        )
    if ex.pool_tokens is not None and ex.banked_pool is not None and ex.pool_tokens != ex.banked_pool:
        return Verdict(
            "pool",
            False,
            expected,
            observed,
            f"gates.pool_tokens={ex.pool_tokens:,} disagrees with the pool banked for this config "
            f"fingerprint ({ex.banked_pool:,}): fix the config or re-bank",
            evidence,
        )
    if len(observed) > 1:
        return Verdict(
            "pool",
            False,
            expected,
            observed,
            "the pool changed within the log ("
            + " → ".join(f"{n:,}" for n in observed)
            + "): a different configuration booted",
            evidence,
        )
    got = observed[0]
    want = ex.banked_pool if ex.banked_pool is not None else ex.pool_tokens
    if want is None:
        return Verdict(
            "pool",
            True,
            expected,
            observed,
            f"{got:,} tokens; nothing to compare with (no gates.pool_tokens, nothing banked): `--bank` records it",
            evidence,
        )
    source = "banked pool" if ex.banked_pool is not None else "gates.pool_tokens"
    if got != want:
        return Verdict(
            "pool",
            False,
            expected,
            observed,
            f"KV cache size is {got:,} tokens, {source} is {want:,}: a different configuration booted",
            evidence,
        )
    return Verdict("pool", True, expected, observed, f"{got:,} tokens = {source}", evidence)
