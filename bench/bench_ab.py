#!/usr/bin/env python3
"""`ab run` campaign overhead on the rig: wall time beyond the cells' own run time and the boots.

    .venv/bin/python bench/bench_ab.py [--rounds 2] [--c16 64x16x512] [--smoke 8x1x512]

One in-process campaign (`campaign.drive.run_campaign`) of two drafters (copies of the rig's drafter,
each with its own emulator acceptance profile, paced by engine steps) over smoke + c16, on a stack that
serves before it (so the end restores it). The anchor is the cells' own run time: the sum of every
cell's request wall time (BenchResult.duration_s). Boots (`up` through the swap path, gates included),
the one drafter sync and the final restore are the swap path's time, printed apart and not counted as
campaign overhead. overhead = wall − boots − sync − restore − cells' own run time: the model check and
the two /metrics scrapes per cell, the boot-id check after each cell, the journal rows, the ETA, and the
report (bootstrap intervals) at the end. Goal (issue 12): overhead ≤ 5 % of the cells' own run time.
Holds the rig's test lock.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rig"))

import rig as riglib  # noqa: E402

GOAL = 0.05
PROFILES = {"A": [0.6, 0.45, 0.33, 0.25, 0.18, 0.13, 0.1], "B": [0.85, 0.72, 0.6, 0.5, 0.4, 0.32, 0.25]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--smoke", default="8x1x512", help="smoke cell size, PROMPTSxCONCxTOKENS")
    ap.add_argument("--c16", default="64x16x512", help="c16 cell size")
    ap.add_argument("--steps-per-s", type=int, default=100, help="emulator engine steps per second per stream")
    a = ap.parse_args()

    info = riglib.load_info()
    nodes_info = riglib.nodes_from_info(info)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    os.environ["XDG_STATE_HOME"] = str(tmp / "state")
    from sparkserve.campaign.drive import CampaignRequest, run_campaign
    from sparkserve.config import load_config
    from sparkserve.deploy.stack import down
    from sparkserve.deploy.up import up
    from sparkserve.measure.ab_records import parse_size
    from sparkserve.nodes.factory import open_nodes

    data = yaml.safe_load(Path(info["rig_yaml"]).read_text())
    data["serve"]["env"] = {**(data["serve"].get("env") or {}), "SSEMU_BOOT_SECONDS": "1.2"}
    data["serve"]["gpu_memory_utilization"] = 0.1
    data.setdefault("gates", {})["smoke"] = {"prompts": 3, "max_tokens": 32, "request_timeout_s": 20}
    cfg_path = tmp / "bench.yaml"
    cfg_path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(cfg_path)
    src = Path(nodes_info[0].srv_dir) / Path(info["models"]["drafter"]).relative_to(info["node_root"])
    drafters = []
    for i, (name, prof) in enumerate(PROFILES.items()):
        d = tmp / f"bench-{name.lower()}"
        shutil.copytree(src, d)
        (d / "ssemu-acceptance.json").write_text(json.dumps({"per_position": prof, "steps_per_s": a.steps_per_s,
                                                             "seed": i + 1}))
        w = d / "model.safetensors"
        b = bytearray(w.read_bytes())
        b[-1] ^= i + 1
        w.write_bytes(bytes(b))
        drafters.append((name, d))
    cells = [parse_size(f"smoke={a.smoke}"), parse_size(f"c16={a.c16}")]
    req = CampaignRequest(drafters=drafters, cells=cells, rounds=a.rounds, seed=1)
    with riglib.exclusive_use(), open_nodes(cfg) as nodes:
        up(cfg, nodes)  # a serving stack: the campaign restores it at the end
        t0 = time.monotonic()
        out = run_campaign(cfg, nodes, req)
        wall = time.monotonic() - t0
        down(cfg, nodes)
    for n in nodes_info:  # the drafter copies the campaign synced to every node
        for arm in out.report.spec.drafters:
            shutil.rmtree(Path(n.srv_dir) / Path(arm.node_path).relative_to(info["node_root"]), ignore_errors=True)
    t = out.timings
    swap_path = t["boots"] + t["sync"] + t["restore"]
    overhead = wall - swap_path - t["requests"]
    boots = len(req.drafters) * a.rounds
    print(f"campaign {out.campaign}: {len(req.drafters)} drafters × {a.rounds} rounds = {boots} boots, cells "
          f"smoke {a.smoke}, c16 {a.c16}; emulator paced at {a.steps_per_s} steps/s per stream")
    print(f"wall {wall:.2f} s = swap path {swap_path:.2f} s (boots+gates {t['boots']:.2f}, sync {t['sync']:.2f}, "
          f"restore {t['restore']:.2f}) + cells' own run time {t['requests']:.2f} s + overhead {overhead:.2f} s")
    print(f"  of the overhead: per-cell model check + scrapes + boot-id check + journal "
          f"{t['cells'] - t['requests']:.2f} s, report (bootstrap) {t['report']:.2f} s, the rest "
          f"{overhead - (t['cells'] - t['requests']) - t['report']:.2f} s")
    ratio = overhead / t["requests"]
    print(f"overhead / cells' own run time = {ratio * 100:.2f} % (goal ≤ {GOAL * 100:.0f} %: "
          f"{'met' if ratio <= GOAL else 'NOT met'})")
    for v in out.report.analysis.verdicts:
        print(f"verdict {v.drafter} vs {v.baseline} on {v.cell}: {v.verdict} ({v.rel.point * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
