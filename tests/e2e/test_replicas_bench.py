"""`bench` and `ab run` with `replicas: 2` on four rig nodes behind the real vllm-router 0.1.17.

`bench` goes through the router by default (the counters from each replica's own /metrics, each one's share of
the requests in the record) and `--replica 2` benches replica 2's head API alone. `ab run --design crossed` runs
A and B at once, one per replica, swapped in round 2; `ab run --design sequential` boots them in turn on
replica 1. Both designs run the same cells and rounds; the test prints each one's wall time and interval widths
(issue 34 Deliver 4; bench/bench_ab_designs.py reads them) and checks each finds the better drafter, names its
design in `ab report`, and leaves the fleet serving behind the router as before.

The four-node rig of test_replicas (addresses 127.0.0.40-43; conftest's ``rig4``, one boot per session).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from e2e_support import E2E, free_port
from replicas_support import E4_ROOT

pytestmark = pytest.mark.rig

NODE_ROOT = E4_ROOT
BASE = [0.6, 0.45, 0.33, 0.25, 0.18, 0.13, 0.1]  # acceptance length 3.04
BETTER = [0.85, 0.72, 0.6, 0.5, 0.4, 0.32, 0.25]  # 4.64
CELLS = ("--cells", "smoke,c16", "--rounds", "2", "--size", "smoke=4x1x128", "--size", "c16=32x16x128",
         "--seed", "7", "--bootstrap", "1000")



def _host(e: E2E, node: str, node_path: str | Path) -> Path:
    return Path(e.rig.node(node).srv_dir) / Path(node_path).relative_to(NODE_ROOT)


def _drafter(e: E2E, tmp: Path, name: str, profile: list[float], *, seed: int, flip: int = 0) -> Path:
    """A local drafter dir with its own emulator acceptance profile, paced by engine steps (tok/s ∝ AL)."""
    d = tmp / name
    shutil.copytree(_host(e, "node-a", e.rig.models["drafter"]), d)
    (d / "ssemu-acceptance.json").write_text(json.dumps({"per_position": profile, "steps_per_s": 100, "seed": seed}))
    if flip:
        w = d / "model.safetensors"
        data = bytearray(w.read_bytes())
        data[-1] ^= flip
        w.write_bytes(bytes(data))
    return d


def _template_and_prompts(tmp: Path) -> tuple[Path, Path]:
    tok = tmp / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}"
        "{% endif %}")}))
    prompts = tmp / "holdout.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"h{i}", "prompt": f"holdout question {i}"}) + "\n"
                               for i in range(40)))
    return tok, prompts


def _width(report: dict, metric: str) -> str:
    """The c16 delta's 95 % interval width for ``metric``, in percentage points."""
    d = next(x for x in report["analysis"]["deltas"] if x["cell"] == "c16" and x["metric"] == metric)["rel"]
    return "n/a" if d["lo"] is None else f"{(d['hi'] - d['lo']) * 100:.1f} pp"


def test_bench_through_the_router_and_one_replica_then_both_ab_designs(e4, tmp_path) -> None:
    started = datetime.now(UTC).isoformat()  # the e2e journal holds earlier tests' rows too
    base = {"replicas": 2, "router": {"port": free_port("127.0.0.1"), "metrics_port": free_port("127.0.0.1")},
            "serve": {"tensor_parallel_size": 2}}
    cfg = e4.config(base)
    tok, prompts = _template_and_prompts(tmp_path)
    p = e4.cli("up", cfg=cfg, timeout=600)
    assert p.returncode == 0, p.stderr
    router = e4.json("status", cfg=cfg)["router"]
    pid = router["pid"]

    # through the router: the cell's counters are both replicas', each one's share counted on its own /metrics
    fleet = e4.json("bench", "--cell", "smoke", "--size", "8x2x64", "--chat-template", str(tok), "--prompts",
                    str(prompts), cfg=cfg, timeout=300)
    assert fleet["ok"] is True and fleet["requests_ok"] == 8, fleet
    assert fleet["router"] == {"url": router["url"], "policy": "round_robin", "replicas": 2}
    assert fleet["url"] == router["url"] and fleet["node"] is None
    shares = {s["replica"]: s["requests"] for s in fleet["per_replica"]}
    assert shares == {1: 4, 2: 4}, fleet["per_replica"]  # round_robin alternates; no other traffic
    assert fleet["acceptance_length"] is not None and fleet["drafts"] > 0
    text = e4.cli("bench", "--cell", "smoke", "--size", "4x1x32", "--chat-template", str(tok), "--prompts",
                  str(prompts), cfg=cfg, timeout=300)
    assert text.returncode == 0 and "requests per replica" in text.stdout and "→ 2 replicas" in text.stdout, text
    # one replica's own head API
    one = e4.json("bench", "--cell", "smoke", "--size", "4x1x64", "--replica", "2", "--chat-template", str(tok),
                  "--prompts", str(prompts), cfg=cfg, timeout=300)
    assert one["ok"] is True and one["replica"] == 2 and one["router"] is None and one["per_replica"] == []
    assert one["url"].startswith("http://127.0.0.42:") and one["node"] == "node-c"
    hist = e4.json("history", "--kind", "bench", cfg=None)
    assert len([x for x in hist["entries"] if x["time"] >= started]) == 3, hist["entries"][:4]
    bad = e4.cli("bench", "--cell", "smoke", "--replica", "3", cfg=cfg)
    assert bad.returncode == 2 and "error: --replica: 3 is not a replica" in bad.stderr, bad.stderr

    a = _drafter(e4, tmp_path, "dfa", BASE, seed=1)
    b = _drafter(e4, tmp_path, "dfb", BETTER, seed=2, flip=1)
    args = ("ab", "run", "--drafter", f"A={a}", "--drafter", f"B={b}", *CELLS, "--chat-template", str(tok),
            "--prompts", str(prompts))
    odd = e4.cli(*args, "--rounds", "1", "--design", "crossed", cfg=cfg)  # the last --rounds wins
    assert odd.returncode == 2 and "error: --rounds:" in odd.stderr, odd.stderr

    runs = {}
    for design in ("crossed", "sequential"):
        t0 = time.monotonic()
        out = e4.json(*args, "--design", design, cfg=cfg, timeout=900)
        runs[design] = (time.monotonic() - t0, out)
        assert out["spec"]["design"] == design
        v = {x["drafter"]: x for x in out["analysis"]["verdicts"]}
        assert v["B"]["verdict"] == "KEEP", (design, v)
        st = e4.json("status", cfg=cfg)  # the fleet serves again behind the router
        assert st["ok"] is True and st["serving"] == 2, st
    crossed, sequential = runs["crossed"][1], runs["sequential"][1]
    placed = {(w["round"], w["drafter"], w["replica"]) for w in crossed["waves"]}
    assert placed == {(1, "A", 1), (1, "B", 2), (2, "A", 2), (2, "B", 1)} or \
        placed == {(1, "A", 2), (1, "B", 1), (2, "A", 1), (2, "B", 2)}, placed
    assert {w["replica"] for w in sequential["waves"]} == {None}
    assert all(b["replica"] is None for b in sequential["boots"])
    print("\nab run on 2 replicas, 2 drafters × 2 rounds, smoke 4×c1×128 + c16 32×c16×128 (card protocol):")
    for design, (wall, out) in runs.items():
        d = next(x for x in out["analysis"]["deltas"] if x["cell"] == "c16" and x["metric"] == "output_tok_s")
        print(f"  {design:10s} wall {wall:6.1f} s · B vs A c16 tok/s {d['rel']['point'] * 100:+.1f} % "
              f"[{d['rel']['lo'] * 100:+.1f}, {d['rel']['hi'] * 100:+.1f}], width {_width(out, 'output_tok_s')}"
              f" · acceptance length width {_width(out, 'acceptance_length')} · timings "
              f"{ {k: round(v, 1) for k, v in out.get('timings', {}).items()} }")
    if os.environ.get("AB_DESIGNS_OUT"):  # bench/bench_ab_designs.py: the figures, not a timed assertion here
        Path(os.environ["AB_DESIGNS_OUT"]).write_text(json.dumps({design: {
            "wall_s": wall, "timings": out.get("timings", {}),
            "deltas": [x for x in out["analysis"]["deltas"] if x["cell"] == "c16"]}
            for design, (wall, out) in runs.items()}))

    rep = e4.cli("ab", "report", str(crossed["campaign"]), cfg=None)
    assert rep.returncode == 0 and "Design: crossed over on 2 replicas" in rep.stdout, rep.stdout
    md = e4.cli("ab", "report", str(sequential["campaign"]), "--markdown", cfg=None)
    assert md.returncode == 0 and "Design: sequential: one stack boots the drafters in turn" in md.stdout

    st = e4.json("status", cfg=cfg)
    assert st["router"]["pid"] != pid  # the campaign stopped the router; the restore started it again
    p = e4.cli("down", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert e4.leftovers() == {}
