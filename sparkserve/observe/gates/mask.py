"""``mask`` — required when the drafter holds ``mask_embedding.pt`` or ``gates.mask_token_id`` is set:
``Loaded DFlash mask embedding for mask_token_id N …`` on every rank, with the expected id."""

from __future__ import annotations

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Verdict
from sparkserve.observe.gates.evidence import ev, nodes_text
from sparkserve.observe.logpatterns import Kind


def mask_gate(an: Analysis, ex: Expectations) -> Verdict:
    required = ex.mask_file is True or ex.mask_token_id is not None
    expected = {"required": required, "mask_token_id": ex.mask_token_id, "ranks": list(ex.ranks)}
    observed = {r: (an.ranks[r].mask_token_id if r in an.ranks else None) for r in ex.ranks}
    lines = an.events(Kind.MASK_LOADED)
    evidence = [ev(log, e) for log, e in lines]
    if not required:
        return Verdict(
            "mask",
            True,
            expected,
            observed,
            "the drafter holds no mask_embedding.pt and gates.mask_token_id is unset: nothing to load",
            evidence,
        )
    problems = []
    if ex.mask_file is False:
        problems.append(
            f"the drafter has no mask_embedding.pt but gates.mask_token_id={ex.mask_token_id} expects "
            "one: the mask would be silently ignored"
        )
    for r in ex.ranks:
        st = an.ranks.get(r)
        if st is None or not st.mask:
            where = ", ".join(sorted(st.nodes)) if st else nodes_text(an)
            problems.append(
                f"rank {r}: no `Loaded DFlash mask embedding` line (looked in {where}): the mask was silently ignored"
            )
        elif ex.mask_token_id is not None and st.mask_token_id != ex.mask_token_id:
            problems.append(f"rank {r} loaded mask_token_id {st.mask_token_id}, expected {ex.mask_token_id}")
    if problems:
        return Verdict("mask", False, expected, observed, "; ".join(problems), evidence)
    ids = sorted({v for v in observed.values() if v is not None})
    return Verdict(
        "mask",
        True,
        expected,
        observed,
        f"mask embedding loaded on every rank ({', '.join(ex.ranks)}), mask_token_id {', '.join(map(str, ids))}",
        evidence,
    )
