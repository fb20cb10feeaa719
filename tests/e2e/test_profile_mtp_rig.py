"""`profile: mtp` on the rig: the target's built-in MTP head boots with no drafter section, no drafter mount and
no drafter sync, and passes the gates that apply (no mask to load, no drafter-group line; the card banks no pool
for MTP, so the first boot's pool is banked and judged against); a bench of it is then printed beside the card's
own MTP row (tests/fixtures/card_rows, written from the card's RESULTS.md: ``base-mtp-n2-c1``, H200).

The emulator learned mtp from vLLM 0.33.0 itself: ``SpeculativeConfig`` takes the target as the draft model when
method is mtp and no model is given (vllm/config/speculative.py), and ``MTPSpeculator`` (a
``TargetDependentARSpeculator``) prints ``Capturing model for speculator...`` (target_dependent_ar/speculator.py:110).
The card measured its MTP row at K=2 (``base-mtp-n2``) while its advice is K=3: this run sets K=2 over the profile
(a field the config writes wins) so its cell has the row's shape (c1 × 1024 tokens, K=2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.rig

REF = Path(__file__).resolve().parents[1] / "fixtures" / "card_rows" / "all"


def test_mtp_boots_without_a_drafter_passes_its_gates_and_sits_beside_the_cards_row(e2e, tmp_path) -> None:
    data = e2e.base()
    data.pop("drafter")
    data["gates"] = {k: v for k, v in data["gates"].items() if k not in ("pool_tokens", "mask_token_id")}
    cfg = e2e.config({"profile": "mtp", "speculative": {"num_speculative_tokens": 2}}, data=data)
    c = e2e.load(cfg)
    assert (c.speculative.method, c.drafter, c.gates.pool_tokens, c.gates.mask_token_id) == ("mtp", None, None, None)

    up = e2e.cli("up", cfg=cfg, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "all gates passed" in up.stdout
    assert "drafter: none (speculative.method mtp" in up.stderr + up.stdout
    assert "has not been validated by us yet" in up.stderr  # the card's words, on every `up` of the profile
    try:
        for n in e2e.rig.nodes:  # no drafter mount; the argv names no drafter model
            (ctr,) = [x for x in e2e.managed(n.name) if x.status == "running"]
            assert "/models/drafter" not in {m["Destination"] for m in ctr.attrs["Mounts"]}
            argv = ctr.attrs["Args"]
            assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp",
                                                                                "num_speculative_tokens": 2}
        first = e2e.json("gates", "--bank", cfg=cfg, timeout=120)
        by = {g["name"]: g for g in first["gates"]}
        assert first["ok"] and by["mask"]["ok"] and "nothing to load" in by["mask"]["reason"]
        pool = by["pool"]["observed"][0]
        again = {g["name"]: g for g in e2e.json("gates", cfg=cfg, timeout=120)["gates"]}
        assert again["pool"]["ok"] and again["pool"]["expected"]["banked"] == pool  # judged against the banked pool

        result = tmp_path / "rig-mtp.json"
        b = e2e.cli("bench", "--cell", "c1", "--size", "3x1x1024", "--protocol", "forced", "--json", cfg=cfg,
                    timeout=300)
        assert b.returncode == 0, b.stderr
        result.write_text(b.stdout)
        assert json.loads(b.stdout)["k"] == 2
        rep = e2e.cli("ab", "report", "--bench", str(result), "--reference", str(REF), "--reference-match",
                      "^base-mtp", "--hardware", "rig: CPU emulator", "--card-rows", str(tmp_path / "rows"),
                      cfg=None)
        assert rep.returncode == 0, rep.stderr
        (line,) = [ln for ln in rep.stdout.splitlines() if "  vs  " in ln]
        assert line.lstrip().startswith("rig-mtp-k2-c1 [rig: CPU emulator]")
        assert "base-mtp-n2-c1 [H200] 2.424 / 266.0" in line and "tok/s not compared: rig: CPU emulator vs H200" in line
        row = json.loads((tmp_path / "rows" / "rig-mtp-k2-c1.json").read_text())
        assert row["hardware"] == "rig: CPU emulator" and row["concurrency"] == 1 and row["max_tokens"] == 1024
    finally:
        assert e2e.cli("down", cfg=cfg).returncode == 0
