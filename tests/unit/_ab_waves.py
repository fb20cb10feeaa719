"""Synthetic banked A/B waves for the unit tests of the campaign's pure core and its CLI."""

from __future__ import annotations

import numpy as np

from sparkserve.journal import Journal
from sparkserve.measure.ab_records import Arm, Boot, CampaignSpec, CellSpec, Pins, Rule, Samples, Wave
from sparkserve.measure.records import BenchResult

CELLS = [CellSpec(name="smoke", prompts=12, concurrency=1, max_tokens=256),
         CellSpec(name="c16", prompts=32, concurrency=16, max_tokens=256)]


def spec(names: list[str], rounds: int = 2, seed: int = 5) -> CampaignSpec:
    return CampaignSpec(
        drafters=[Arm(name=n, source=f"/d/{n}", digest=f"{i:064x}", node_path=f"/n/{n}") for i, n in enumerate(names)],
        cells=CELLS, rounds=rounds, seed=seed, prompts_source="builtin", prompts_sha256="ab" * 32,
        config_sha256="cd" * 32, rule=Rule(baseline=names[0], primary="c16"), bootstrap=500,
        sampling={"temperature": 1.0, "top_p": 0.95, "enable_thinking": True, "forced_length": True},
    )


def wave(rng: np.random.Generator, drafter: str, cell: CellSpec, rnd: int, *, al: float, step_s: float,
         slot: int = 0, excluded: str | None = None, wid: int = 0) -> Wave:
    """A wave whose requests decode ``max_tokens`` in steps of ~``al`` tokens, each step ``step_s`` long."""
    n = cell.prompts
    tokens = [cell.max_tokens] * n
    per_req_al = rng.normal(al, 0.15, n).clip(1.05, 8)
    chunks = [int(round(t / a)) for t, a in zip(tokens, per_req_al, strict=True)]
    ttft = list(rng.uniform(0.01, 0.03, n))
    lat = [c * step_s * rng.normal(1, 0.02) + f for c, f in zip(chunks, ttft, strict=True)]
    duration = sum(lat) / cell.concurrency
    pp = [min(1.0, (al - 1) / 7 * 1.6 * 0.8 ** p) for p in range(7)]
    res = BenchResult(cell=cell.name, prompts=n, concurrency=cell.concurrency, max_tokens=cell.max_tokens,
                      requests_ok=n, stream_errors=0, output_tokens=sum(tokens), duration_s=duration,
                      output_tok_s=round(sum(tokens) / duration, 3), acceptance_length=round(
                          sum(tokens) / sum(chunks), 6), per_position_acceptance=pp, drafts=sum(chunks),
                      draft_tokens=7 * sum(chunks), accepted_tokens=sum(tokens) - sum(chunks))
    pins = Pins(config_sha256="cd" * 32, fingerprint="f" * 64, image_id="sha256:" + "e" * 64,
                drafter_digest="d" * 64, prompts_sha256="ab" * 32, boot_id=f"boot-{drafter}-{rnd}")
    return Wave(slot=slot, round=rnd, drafter=drafter, cell=cell.name, boot_row=slot + 1, result=res,
                samples=Samples(tokens=tokens, chunks=chunks, ttft_s=ttft, latency_s=lat), pins=pins,
                excluded=excluded, id=wid)


PROFILES = {"A": 3.0, "B": 3.6, "C": 3.0, "D": 2.5}


def campaign(names: list[str], rounds: int = 2, seed: int = 11) -> tuple[CampaignSpec, list[Wave]]:
    rng = np.random.default_rng(seed)
    sp = spec(names, rounds)
    waves = []
    for k, slot in enumerate(sp.order):
        for cell in CELLS:
            waves.append(wave(rng, slot.drafter, cell, slot.round, al=PROFILES[slot.drafter], step_s=0.004,
                              slot=k, wid=len(waves) + 1))
    return sp, waves


def bank(j: Journal, sp: CampaignSpec, waves: list[Wave], boots: list[Boot] | None = None,
         status: str = "done") -> int:
    """Write a campaign, one boot row per slot (plus ``boots``) and its waves to the journal; its id."""
    cid = j.create_campaign(sp.config_sha256, sp.model_dump_json())
    rows: dict[int, int] = {}
    for w in waves:
        if w.slot not in rows:
            b = Boot(slot=w.slot, round=w.round, drafter=w.drafter, ok=True, boot_id=w.pins.boot_id)
            rows[w.slot] = j.record_campaign_boot(cid, w.slot, True, b.model_dump_json())
        w2 = w.model_copy(update={"boot_row": rows[w.slot], "id": None})
        j.record_campaign_wave(cid, rows[w.slot], w.slot, w.cell, w.counts, w2.model_dump_json(exclude={"id"}))
    for b in boots or []:
        j.record_campaign_boot(cid, b.slot, b.ok, b.model_dump_json())
    j.set_campaign_status(cid, status)
    return cid
