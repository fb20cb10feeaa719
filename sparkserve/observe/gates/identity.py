"""``identity`` — the same image ID and the same drafter digest on every node (and one NCCL build, as each
rank's log names it). Not collected → fails."""

from __future__ import annotations

from collections.abc import Mapping

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations, NodeIdentity
from sparkserve.observe.gate_report import Evidence, Verdict


def identity_gate(identity: Mapping[str, NodeIdentity] | None, ex: Expectations, an: Analysis | None = None) -> Verdict:
    expected = "the same image ID and drafter digest on every node"
    if not identity:
        return Verdict("identity", False, expected, None, "not run: no image IDs or drafter digests collected")
    observed = {n: {"image_id": i.image_id, "drafter_digest": i.drafter_digest} for n, i in identity.items()}
    for n, f in (an.nccl if an is not None else {}).items():  # the NCCL each rank loaded, from its own log
        observed.setdefault(n, {})["nccl"] = {"version": f.version, "cuda": f.cuda, "library": f.library}
    evidence = []
    for n, i in identity.items():
        evidence.append(Evidence(n, None, f"image {i.image_id or '?'}"))
        evidence.append(Evidence(n, None, f"drafter {i.drafter_digest or '?'}"))
    problems = []
    for what, attr in (("image ID", "image_id"), ("drafter digest", "drafter_digest")):
        vals = {n: getattr(i, attr) for n, i in identity.items()}
        missing = sorted(n for n, v in vals.items() if not v)
        if missing:
            problems.append(f"no {what} from {', '.join(missing)}")
        distinct = {v for v in vals.values() if v}
        if len(distinct) > 1:
            problems.append(f"{what}s differ: " + ", ".join(f"{n}={(v or '?')[:19]}" for n, v in vals.items()))
    nccl = an.nccl if an is not None else {}
    for what, attr in (("NCCL version", "version"), ("NCCL library", "library")):
        vals = {n: getattr(f, attr) for n, f in nccl.items() if getattr(f, attr)}
        if len(set(vals.values())) > 1:  # a build one node loads and the other does not (pip vs system libnccl)
            problems.append(f"{what} differs: " + ", ".join(f"{n}={v}" for n, v in vals.items()))
    for n in ex.nodes or ():
        if n not in identity:
            problems.append(f"no identity facts from {n}")
    if problems:
        return Verdict("identity", False, expected, observed, "; ".join(problems), evidence)
    return Verdict(
        "identity",
        True,
        expected,
        observed,
        f"one image and one drafter digest on {len(identity)} node(s)",
        evidence,
    )
