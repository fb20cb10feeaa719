"""`sparkserve bench` after `up` on the two-node rig (issue 41): the warm-up keeps the first bench after a boot
level with the second; latency, throughput and power fields; the card template read from the head over SSH.

The emulator stalls the engine the first time it runs each batch size (SSEMU_FIRST_BATCH_S, scaled from real
vLLM's ~4 s first-run cost on an H100): a bench without a warm-up at a concurrency the engine has not run yet
reads low, as on real vLLM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.rig

# a tiny jinja chat template for the rig's target (its tokenizer files carry none): one user turn, thinking tag
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking %}<think>{% endif %}{% endif %}")


def test_first_bench_after_up_reads_as_the_second_and_the_card_template_comes_from_the_head(
        e2e, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # paced by the emulator's clock, not the shared CPUs: 1,000 tok/s a stream, 0.2 s per first-seen batch size
    cfg = e2e.config({"serve": {"env": {"SSEMU_TOKEN_RATE": "1000", "SSEMU_FIRST_BATCH_S": "0.2"}}})
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    first = e2e.json("bench", "--protocol", "forced", "--cell", "c16", "--size", "32x4x256", cfg=cfg)
    second = e2e.json("bench", "--protocol", "forced", "--cell", "c16", "--size", "32x4x256", cfg=cfg)
    assert first["ok"] and second["ok"], (first["refused"], second["refused"])
    assert first["warmup"]["requests"] == 8 and first["warmup"]["concurrency"] == 4 and first["warmup"]["errors"] == 0
    assert first["output_tokens"] == 32 * 256 == second["output_tokens"]  # the warm-up's tokens are not the cell's
    assert abs(first["output_tok_s"] / second["output_tok_s"] - 1) < 0.1, (first["output_tok_s"],
                                                                            second["output_tok_s"])
    # without a warm-up, sizes 5..8 are new to this boot: the first c8 bench pays for them, the next does not
    cold = e2e.json("bench", "--protocol", "forced", "--cell", "c16", "--size", "32x8x256", "--warmup", "0", cfg=cfg)
    warm = e2e.json("bench", "--protocol", "forced", "--cell", "c16", "--size", "32x8x256", "--warmup", "0", cfg=cfg)
    assert cold["warmup"]["requests"] == 0
    assert cold["output_tok_s"] < 0.75 * warm["output_tok_s"], (cold["output_tok_s"], warm["output_tok_s"])

    lat = first["latency"]
    assert lat["streamed"] and all(lat[k]["n"] for k in ("ttft", "tpot", "e2e")) and lat["itl"]["n"] > 32
    assert set(lat["e2e"]) == {"n", "mean_ms", "median_ms", "p90_ms", "p99_ms"}
    assert first["requests_per_s"] > 0 and first["output_len_mean"] == 256 == first["output_len_p50"]
    power = first["power"]  # the rig's nodes have no GPU: named, no figure invented
    assert power["joules_per_token"] is None and [n["node"] for n in power["nodes"]] == ["node-a", "node-b"]
    assert all(n["mean_w"] is None and "no nvidia-smi" in n["note"] for n in power["nodes"])
    hist = e2e.json("history", "--kind", "bench", cfg=None)
    assert any("warm-up 8" in e["summary"] for e in hist["entries"]), hist["entries"]

    # the card protocol from a machine without the target: the template is read from the head, then cached
    target = e2e.load(cfg).model.target
    assert not Path(str(target)).is_dir()  # node-local path: this machine has no such directory
    on_head = e2e.rig.head.host_path(str(target)) / "chat_template.jinja"
    on_head.write_text(TEMPLATE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        p = e2e.cli("bench", "--cell", "smoke", "--size", "4x2x32", cfg=cfg)
        assert p.returncode == 0, p.stderr
        assert "chat template read from node-a" in p.stderr
        card = e2e.json("bench", "--cell", "smoke", "--size", "4x2x32", cfg=cfg)
    finally:
        on_head.unlink()
    assert card["ok"] and card["protocol"] == "card" and card["chat_template"].startswith(str(tmp_path / "cache"))
    assert card["latency"]["ttft"] is None and "streamed run" in card["latency"]["note"]
    assert card["latency"]["e2e"]["n"] == 4
