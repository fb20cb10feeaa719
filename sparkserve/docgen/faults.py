"""The fault catalogue and the troubleshooting page: from :mod:`sparkserve.observe.logpatterns` (the advice per
fault kind lives here, and a fault kind without advice fails the check), the first-contact errors
(:mod:`sparkserve.docgen.first_contact`) and the gates' own words (:mod:`sparkserve.observe.gate_report`)."""

from __future__ import annotations

from typing import Any

from sparkserve.docgen.base import HEADER

#: What each fault kind means on a pair of DGX Sparks, and what to do. A new FaultKind without advice here
#: fails `scripts/gen-docs --check` (and so the docs test).
FAULT_ADVICE: dict[str, tuple[str, str]] = {
    "engine_dead": (
        "vLLM's engine core process died; the API server lives on and answers `/health` until it notices. On a "
        "Spark the usual causes are a worker OOM on unified memory, a kernel the image was not built for "
        "(SM121), or a peer rank that went away.",
        "Read the rank's log above the line for the first traceback (`sparkserve logs analyze` names it as the "
        "fault's `why`); `sparkserve down` saved every rank's log. Check `sparkserve doctor` for memory headroom."),
    "worker_died": (
        "A worker process of the multiproc (or Ray) executor exited; the other rank then waits in a collective "
        "until its timeout.",
        "Find the rank whose worker died first (the fault's node); its log holds the cause. A follower that "
        "died makes the head hang: `up` and `gates` name it. Restart with `sparkserve up` once fixed."),
    "nccl": (
        "NCCL (the ConnectX-7 link between the Sparks) failed: a watchdog timeout, an RDMA queue-pair error, a "
        "transport that could not be set up.",
        "Check the cable and both ports are up (`ibdev2netdev`), that `fabric.hca`/`fabric.interface` pick the "
        "right device (`sparkserve doctor` shows the NCCL env it derived), and the MTU on both ends. See "
        "[the fabric](concepts/fabric.md)."),
    "oom": (
        "CUDA ran out of memory. On GB10 the GPU and the OS share 128 GB of unified memory: page cache, other "
        "processes and a second stack all count.",
        "Lower `serve.gpu_memory_utilization` or `serve.kv_cache_memory_bytes`, stop other GPU users, drop "
        "caches; the watchdog (`watchdog.memory_floor_bytes`) stops every rank before the host wedges. See "
        "[GB10 guards](concepts/gb10-guards.md)."),
    "timeout": (
        "Something waited too long: an RPC between engine and workers, the engine's start-up, a collective "
        "whose peer never came.",
        "A dead or stuck peer is the usual reason: look at the other rank's log first. A cold boot that JIT "
        "compiles can exceed `serve.ready_timeout_s`; raise it for the first boot on a new image."),
    "traceback": (
        "A Python traceback in a rank's log that no more specific pattern explains.",
        "The exception line at the end of the traceback is the cause; `sparkserve logs analyze FILE` quotes it."),
    "other": (
        "A fault line of another kind: a kernel Xid, an assertion, an engine error that ends the boot.",
        "The fault's evidence line and its `why` (in `logs analyze --json`) say what it is; attach a "
        "`sparkserve bundle` to a bug report."),
}


def _fault_rows() -> list[Any]:
    from sparkserve.observe.logpatterns import PATTERNS

    return [p for p in PATTERNS if p.fault is not None]


def faults_page() -> str:
    from sparkserve.observe.logpatterns import FaultKind

    out = [HEADER + "# Fault catalogue\n",
           "Every log line sparkserve treats as a fault, from the one table of vLLM log patterns "
           "(`sparkserve/observe/logpatterns.py`). A *fatal* line ends a boot at once (`up` stops every rank); "
           "the others are judged by the `faults` gate. The needles are the literal strings a line must contain "
           "before its pattern is tried.\n",
           "| fault kind | fatal | needles | where it comes from |", "|---|---|---|---|"]
    for p in sorted(_fault_rows(), key=lambda p: list(FaultKind).index(p.fault)):
        needles = ", ".join(f"`{n}`" for n in p.needles).replace("|", "\\|")
        notes = " ".join(p.notes.split()).replace("|", "\\|")
        out.append(f"| [{p.fault.value}](../troubleshooting.md#{p.fault.value}) | "
                   f"{'yes' if p.fatal else 'no'} | {needles} | {notes} |")
    return "\n".join(out) + "\n"


#: What a failed gate means and what to do, per gate (a gate without advice fails `scripts/gen-docs --check`).
GATE_ADVICE: dict[str, tuple[str, str]] = {
    "pool": ("A rank's KV pool (`KV cache size: N tokens`) is not the expected one: another KV size, GMU, context "
             "length, drafter or image changed the memory plan — the card calls this line its 8-GiB "
             "discriminator.",
             "Compare `serve.kv_cache_memory_bytes`, `serve.gpu_memory_utilization` and `serve.max_model_len` with "
             "the card's; a deliberate change: set `gates.pool_tokens` to the new pool, or `gates --bank` it."),
    "graphs": ("CUDA graphs were not captured on a rank (eager, a mode downgrade, or capture that never "
               "finished): that rank decodes several times slower.",
               "The failure names the rank; read its log around `Capturing CUDA graphs`. `serve.enforce_eager` "
               "and `cudagraph_mode: NONE` fail this gate by design."),
    "mask": ("A rank did not log `Loaded DFlash mask embedding …`: vLLM silently used the embedding row of "
             "mask_token_id instead of the trained mask — the card says do not serve.",
             "Put `mask_embedding.pt` next to the drafter's weights on every node (`validate` checks it), and "
             "make `gates.mask_token_id` the drafter's."),
    "smoke": ("The smoke cell (`gates.smoke`) had a request fail, time out or stream an error.",
              "The reason names the first failed request; `sparkserve logs analyze` on the head's log usually "
              "names the fault behind it."),
    "faults": ("A rank's log holds a fault line, a rank's engine is not alive, or NCCL fell back to sockets.",
               "See the fault kinds below; `sparkserve logs analyze` names each line and its `why`."),
    "runner": ("A rank did not walk the V2 model runner (`Using V2 Model Runner`): the DFlash2 proposer is "
               "skipped on the V1 path.",
               "Do not force `VLLM_USE_V2_MODEL_RUNNER=0` in `serve.env`; use the card's image."),
    "signature": ("A rank lacks a line the image's dialect says proves the profile's path (the card's fork: the "
                  "`FLASHINFER_MLA_SPARSE_SM90` KV-layout line, `DFLASH2-DRAFTER-GROUP`).",
                  "The image is not the one the dialect names, or its patches are missing: `sparkserve image "
                  "verify`; see [profiles and dialects](concepts/profiles-and-dialects.md)."),
    "identity": ("The nodes do not run the same image (content fingerprint) or the same drafter (manifest "
                 "digest).",
                 "`sparkserve image ship` and `sparkserve up` (which syncs the drafter) make them one."),
}


def _gate_section() -> list[str]:
    from sparkserve.observe.gate_report import CARD_GATES, EXTRA_GATES, gate_story

    out = ["## A gate failed { #a-gate-failed }\n",
           f"`up` and `gates` judge {gate_story()} ([the gates](concepts/gates.md)). A failed gate stops `up` "
           "(exit 1) and names the rank it is about.\n"]
    for name in (*CARD_GATES, *EXTRA_GATES):
        meaning, action = GATE_ADVICE[name]
        whose = f"the card's \"{CARD_GATES[name]}\"" if name in CARD_GATES else f"sparkserve's: {EXTRA_GATES[name]}"
        out.append(f"### The `{name}` gate {{ #gate-{name} }}\n")
        out.append(f"*{whose}.* **What it means.** {meaning}\n")
        out.append(f"**What to do.** {action}\n")
    return out


def troubleshooting_page() -> str:
    from sparkserve.docgen.first_contact import first_contact_section
    from sparkserve.observe.logpatterns import FaultKind

    rows = _fault_rows()
    out = [HEADER + "# Troubleshooting\n",
           "Before anything else: `sparkserve doctor`, then `sparkserve logs analyze` on the logs `down` (or a "
           "failed `up`) saved, and for a bug report `sparkserve bundle`. Three parts: "
           "[first contact](#first-contact) (the errors before any rank starts), [a gate failed](#a-gate-failed), "
           "and [faults in a rank's log](#faults-in-a-ranks-log).\n",
           *first_contact_section(), *_gate_section(),
           "## Faults in a rank's log { #faults-in-a-ranks-log }\n",
           "Each kind of fault sparkserve finds in a rank's log (`up`, `gates`, `logs analyze`): what it means on "
           "a pair of DGX Sparks and what to do. The lines behind each kind are in the "
           "[fault catalogue](reference/faults.md).\n"]
    for kind in FaultKind:
        meaning, action = FAULT_ADVICE[kind.value]
        mine = [p for p in rows if p.fault == kind]
        fatal = sum(p.fatal for p in mine)
        out.append(f"### {kind.value} {{ #{kind.value} }}\n")
        out.append(f"**What it means.** {meaning}\n")
        out.append(f"**What to do.** {action}\n")
        out.append(f"*{len(mine)} pattern(s), {fatal} of them fatal at boot.*\n" if mine else
                   "*No pattern of its own: what a rank's log shows when no more specific pattern matches.*\n")
    return "\n".join(out).rstrip() + "\n"
