#!/usr/bin/env python3
"""sparkserve's bench client against vLLM 0.33.0's own ``vllm bench serve``, on one emulator server.

Run (from the repository root, with the project venv)::

    .venv/bin/python bench/bench_client_vs_vllm.py            # about two minutes
    .venv/bin/python bench/bench_client_vs_vllm.py --json

Part 1 — agreement, crossed (issue 41). The engine emulator (tests/rig/emulator/vllm_emulator.py, a plain host
process on 127.0.0.1, DFlash K=7, default acceptance profile, its first-run-per-batch-size stall on) serves both
clients the same prompts with the same request (thinking on, T 1.0, top_p 0.95, forced length). After ONE boot per
cell the clients run in both orders, ``--rounds`` times: ours then vLLM's, then vLLM's then ours. Each sends the
same unmeasured warm-up first (ours ``warmup=concurrency × 2``, vLLM's ``--num-warmups`` the same). Printed per
order: each figure's ratio ours / vLLM's — acceptance length (/metrics deltas), output tok/s, E2E p50, TTFT p50
and TPOT p50 (vLLM's definitions on both sides). Goal: every ratio within 3 % in both orders. Then per cell the
pooled ratio over every run against each client's own run-to-run spread (``pooled``): on real vLLM one client's
two runs of one cell differ by more than 3 %, so the pooled ratio and its noise floor are the read there.

``vllm bench serve`` invocation (0.33.0): ``--backend openai-chat --endpoint /v1/chat/completions
--dataset-name custom --dataset-path P.jsonl --skip-tokenizer-init --disable-shuffle --ignore-eos
--temperature 1.0 --top-p 0.95 --chat-template-kwargs '{"enable_thinking": true}' --extra-body
'{"max_completion_tokens": T, "min_tokens": T}' --max-concurrency C --num-prompts N --num-warmups 2C
--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99``.
Without a tokenizer its custom dataset sets every request to 1 output token; ``--extra-body`` (merged
into the payload last) restores the forced length. The custom dataset loader needs ``pandas``.

Against a server that already runs (issue 41 item 5: real vLLM on the GPU machine, tests/real/part_benchcross.py)::

    python3 bench/bench_client_vs_vllm.py --url http://127.0.0.1:18000 --model tiny --vllm /path/to/vllm \
        --cell c1=20x1x256 --cell c8=96x8x256 --rounds 1 --json

runs Part 1 only, on that server's one boot: the same crossing, cell by cell, with ``--vllm`` (an executable whose
``bench serve`` is vLLM's own client: the carried vLLM's launcher on the device) as the other client. The server
must serve ``--model`` with a chat template; the figures are that engine's.

Part 2 — capacity. The emulator is pinned to CPU 1 with ``SSEMU_TOKEN_RATE=0`` (as fast as it can),
our client to CPU 0. Reported: wall tokens/s, and tokens per CPU-second of the client process (what
one core sustains). Goal ≥ 20,000 streamed tokens/s. Run with speculative decoding (several tokens
per SSE chunk, as vLLM streams a spec-decode step) and without (one token per chunk).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkserve.measure.prompts import builtin_prompts  # noqa: E402
from sparkserve.measure.records import Cell  # noqa: E402
from sparkserve.measure.run import default_warmup, run_cell  # noqa: E402

EMULATOR = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
TINY_MODELS = REPO / "tests" / "helpers" / "tiny_models.py"
MODEL = "glm-5.3-flash"
VLLM = Path(sys.executable).parent / "vllm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Emulator:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def make_models(root: Path) -> tuple[Path, Path]:
    target, drafter = root / "target", root / "drafter"
    subprocess.run([sys.executable, str(TINY_MODELS), "target", str(target)], check=True)
    subprocess.run([sys.executable, str(TINY_MODELS), "drafter", str(drafter)], check=True)
    return target, drafter


def start_emulator(
    target: Path, drafter: Path, workdir: Path, *, rate: float, spec: bool = True, cpu: int | None = None
) -> Emulator:
    port = free_port()
    argv = [sys.executable, str(EMULATOR), "serve", str(target), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", MODEL, "--seed", "1"]
    if spec:
        argv += ["--speculative-config",
                 json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 7})]
    env = {**os.environ, "SSEMU_TOKEN_RATE": str(rate), "SSEMU_BOOT_SECONDS": "0.5"}
    log = workdir / f"emulator-{port}.log"
    pre = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    with log.open("wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=pre)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: emulator exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return Emulator(proc, url, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"error: emulator not ready within 120 s; see {log}")


FIGURES = ("al", "tok_s", "e2e_p50_ms", "ttft_p50_ms", "tpot_p50_ms")


def ours(url: str, cell: Cell, model: str = MODEL) -> dict[str, float | None]:
    r = run_cell(url, model, cell, builtin_prompts(), warmup=default_warmup(cell))
    if not r.ok:
        raise SystemExit(f"error: our bench refused the cell: {r.refused}")
    lat = r.latency
    assert lat is not None and lat.ttft is not None and lat.tpot is not None
    return {"tok_s": r.output_tok_s, "al": r.acceptance_length, "tokens": r.output_tokens,
            "e2e_p50_ms": lat.e2e.median_ms, "ttft_p50_ms": lat.ttft.median_ms, "tpot_p50_ms": lat.tpot.median_ms}


def theirs(url: str, cell: Cell, prompts: Path, workdir: Path, model: str = MODEL,
           vllm: Path = VLLM) -> dict[str, float | None]:
    out = workdir / f"vllm-bench-{time.monotonic_ns()}.json"
    argv = [
        str(vllm), "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", url, "--model", model, "--served-model-name", model, "--skip-tokenizer-init",
        "--dataset-name", "custom", "--dataset-path", str(prompts), "--disable-shuffle",
        "--num-prompts", str(cell.prompts), "--max-concurrency", str(cell.concurrency),
        "--ignore-eos", "--temperature", "1.0", "--top-p", "0.95",
        "--chat-template-kwargs", json.dumps({"enable_thinking": True}),
        "--extra-body", json.dumps({"max_completion_tokens": cell.max_tokens, "min_tokens": cell.max_tokens}),
        "--num-warmups", str(default_warmup(cell)), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0 or not out.exists():
        raise SystemExit(f"error: vllm bench serve failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    d = json.loads(out.read_text())
    if d["failed"] or d["total_output_tokens"] != cell.prompts * cell.max_tokens:
        raise SystemExit(f"error: vllm bench serve: {d['failed']} failed, {d['total_output_tokens']} tokens")
    # without a tokenizer vLLM prints E2EL only; TTFT and TPOT by its own formulas from its per-request detail
    # (calculate_metrics: TPOT = (latency − ttft) / (output_len − 1) for output_len > 1; numpy median)
    tpots = [(lat - t) / (n - 1) for n, t, lat in zip(d["output_lens"], d["ttfts"], d["latencies"], strict=True)
             if n > 1]
    return {"tok_s": d["output_throughput"], "al": d.get("spec_decode_acceptance_length"),
            "tokens": d["total_output_tokens"], "e2e_p50_ms": d["median_e2el_ms"],
            "ttft_p50_ms": float(np.median(d["ttfts"])) * 1000, "tpot_p50_ms": float(np.median(tpots)) * 1000}


def _ratios(a: dict[str, float | None], b: dict[str, float | None]) -> dict[str, float | None]:
    return {f: (a[f] / b[f] if a[f] is not None and b[f] else None) for f in FIGURES}  # type: ignore[operator]


def write_prompts(workdir: Path) -> Path:
    """The built-in prompts as ``vllm bench serve``'s custom dataset (one ``{"prompt"}`` per line)."""
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p.messages[-1]["content"]}) + "\n"
                               for p in builtin_prompts().prompts))
    return prompts


def crossed(url: str, cell: Cell, prompts: Path, workdir: Path, rounds: int, *, model: str = MODEL,
            vllm: Path = VLLM, **extra: object) -> list[dict]:
    """One server, one cell: ours → vLLM's, then vLLM's → ours, ``rounds`` times; a row per order and round."""
    rows = []
    for rnd in range(rounds):
        for order in ("ours first", "vllm first"):
            if order == "ours first":
                a = ours(url, cell, model)
                b = theirs(url, cell, prompts, workdir, model, vllm)
            else:
                b = theirs(url, cell, prompts, workdir, model, vllm)
                a = ours(url, cell, model)
            r = _ratios(a, b)
            rows.append({
                "cell": f"{cell.prompts}x c{cell.concurrency} x {cell.max_tokens}", "round": rnd + 1,
                "order": order, **extra, "ours": a, "vllm": b, "ratio": r,
                "within_3pct": all(x is not None and abs(x - 1) <= 0.03 for x in r.values()),
            })
    return rows


def pooled(rows: list[dict]) -> list[dict]:
    """Per cell, over every order and round: each figure's pooled ratio ours / vLLM's (the geometric mean of each
    client's runs, so the ABBA order cancels a drift of the server) against the noise it can be read to: each
    client's own run-to-run spread on that cell (max / min − 1 of its runs). A cell agrees when every pooled
    ratio is within max(3 %, the wider client's spread) of 1.

    Why: on real vLLM (H100, session 47) one client's two runs of the same c8 cell on one boot differed by up to
    13 % (vLLM's own `bench serve` by 10.5 %), so a single pair of runs cannot show a 3 % agreement or its absence;
    the pooled ratio with its noise floor can (tests/unit/test_bench_cross_real.py)."""
    out = []
    for cell in dict.fromkeys(r["cell"] for r in rows):
        mine = [r for r in rows if r["cell"] == cell]
        figs: dict[str, dict[str, float | None]] = {}
        for f in FIGURES:
            a = [r["ours"][f] for r in mine if r["ours"][f]]
            b = [r["vllm"][f] for r in mine if r["vllm"][f]]
            if len(a) != len(mine) or len(b) != len(mine):
                figs[f] = {"ratio": None, "ours_spread": None, "vllm_spread": None, "floor": None, "agrees": None}
                continue
            ratio = float(np.exp(np.mean(np.log(a)) - np.mean(np.log(b))))
            sa, sb = max(a) / min(a) - 1, max(b) / min(b) - 1
            floor = max(0.03, sa, sb)
            figs[f] = {"ratio": ratio, "ours_spread": sa, "vllm_spread": sb, "floor": floor,
                       "agrees": abs(ratio - 1) <= floor}
        known = [v["agrees"] for v in figs.values() if v["agrees"] is not None]
        out.append({"cell": cell, "runs": len(mine), "figures": figs, "agrees": bool(known) and all(known)})
    return out


def agreement(target: Path, drafter: Path, workdir: Path, cells: list[tuple[Cell, float]], rounds: int) -> list[dict]:
    """Both orders after one boot per cell: ours → vLLM's, then vLLM's → ours, ``rounds`` times."""
    prompts = write_prompts(workdir)
    rows = []
    for cell, rate in cells:
        emu = start_emulator(target, drafter, workdir, rate=rate)
        try:
            rows += crossed(emu.url, cell, prompts, workdir, rounds, emulator_rate_per_stream=rate)
        finally:
            emu.stop()
    return rows


def parse_cell(text: str) -> Cell:
    """``NAME=PROMPTSxCONCURRENCYxTOKENS`` (``c8=96x8x256``) → a Cell."""
    name, _, size = text.partition("=")
    try:
        n, c, t = (int(x) for x in size.lower().split("x"))
    except ValueError:
        raise SystemExit(f"error: --cell {text!r}: NAME=PROMPTSxCONCURRENCYxTOKENS, e.g. c8=96x8x256") from None
    return Cell(name or f"c{c}", prompts=n, concurrency=c, max_tokens=t)


def capacity(target: Path, drafter: Path, workdir: Path, spec: bool, cell: Cell) -> dict:
    two_cpus = len(os.sched_getaffinity(0)) >= 2
    emu = start_emulator(target, drafter, workdir, rate=0, spec=spec, cpu=1 if two_cpus else None)
    old = os.sched_getaffinity(0)
    try:
        if two_cpus:
            os.sched_setaffinity(0, {0})
        run_cell(emu.url, MODEL, Cell("warm", 2 * cell.concurrency, cell.concurrency, 256), builtin_prompts())
        c0 = time.process_time()
        r = run_cell(emu.url, MODEL, cell, builtin_prompts())
        cpu = time.process_time() - c0
    finally:
        os.sched_setaffinity(0, old)
        emu.stop()
    if not r.ok:
        raise SystemExit(f"error: capacity run refused: {r.refused}")
    return {
        "speculative": spec,
        "acceptance_length": r.acceptance_length,
        "tokens": r.output_tokens,
        "wall_tok_s": r.output_tok_s,
        "client_cpu_s": cpu,
        "tok_per_client_cpu_s": r.output_tokens / cpu,
        "pinned": two_cpus,
        "meets_20k": min(r.output_tok_s, r.output_tokens / cpu) >= 20000,
    }


def _fig(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.3f}" if x < 100 else f"{x:,.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-capacity", action="store_true", help="Part 1 only")
    ap.add_argument("--url", help="a server that already runs: Part 1 on it (one boot), no emulator, no Part 2")
    ap.add_argument("--model", default=MODEL, help="with --url: the served model name")
    ap.add_argument("--vllm", type=Path, default=VLLM, help="the executable whose `bench serve` is vLLM's client")
    ap.add_argument("--cell", action="append", default=[], help="with --url: NAME=PROMPTSxCONCURRENCYxTOKENS, "
                    "repeated (default: c1=20x1x256 and c8=96x8x256)")
    args = ap.parse_args()
    if not args.vllm.exists():
        raise SystemExit(f"error: {args.vllm}: no vLLM there (vLLM 0.33.0 in this venv, or give --vllm)")
    with tempfile.TemporaryDirectory(prefix="ssbench-") as tmp:
        workdir = Path(tmp)
        if args.url:
            prompts = write_prompts(workdir)
            agree = [row for cell in map(parse_cell, args.cell or ["c1=20x1x256", "c8=96x8x256"])
                     for row in crossed(args.url, cell, prompts, workdir, args.rounds, model=args.model,
                                        vllm=args.vllm)]
            caps: list[dict] = []
        else:
            target, drafter = make_models(workdir / "models")
            cells = [
                (Cell("smoke", prompts=20, concurrency=1, max_tokens=512), 2000.0),
                (Cell("c16-short", prompts=64, concurrency=16, max_tokens=1024), 1000.0),
            ]
            agree = agreement(target, drafter, workdir, cells, args.rounds)
            cap_cell = Cell("capacity", prompts=96, concurrency=16, max_tokens=1024)
            caps = [] if args.no_capacity else [capacity(target, drafter, workdir, True, cap_cell),
                                                capacity(target, drafter, workdir, False, cap_cell)]
    ok = all(r["within_3pct"] for r in agree) and all(c["meets_20k"] for c in caps)
    pools = pooled(agree)
    if args.json:
        print(json.dumps({"ok": ok, "agreement": agree, "pooled": pools, "capacity": caps}, indent=2))
        return 0 if ok else 1
    where = f"{args.url} (one boot)" if args.url else "one emulator boot per cell"
    print(f"Part 1 — sparkserve bench client / `vllm bench serve`, {where}, both orders, each after a warm-up")
    print(f"  {'cell':<20} {'round':>5}  {'order':<11}" + "".join(f"{f:>13}" for f in FIGURES))
    for r in agree:
        print(f"  {r['cell']:<20} {r['round']:>5}  {r['order']:<11}"
              + "".join(f"{r['ratio'][f]:>13.4f}" if r["ratio"][f] is not None else f"{'n/a':>13}"
                        for f in FIGURES)
              + f"  {'OK' if r['within_3pct'] else 'OUTSIDE 3 %'}")
        print(f"  {'':<38}" + "".join(f"{_fig(r['ours'][f]):>13}" for f in FIGURES) + "  (ours)")
        print(f"  {'':<38}" + "".join(f"{_fig(r['vllm'][f]):>13}" for f in FIGURES) + "  (vLLM)")
    print("  pooled per cell (geometric mean of each client's runs, both orders) against each client's own "
          "run-to-run spread:")
    for c in pools:
        print(f"  {c['cell']:<20} {c['runs']:>5}  {'pooled':<11}"
              + "".join(f"{v['ratio']:>13.4f}" if v["ratio"] is not None else f"{'n/a':>13}"
                        for v in c["figures"].values())
              + f"  {'agrees within noise' if c['agrees'] else 'DIFFERS beyond noise'}")
        print(f"  {'':<38}" + "".join(f"{'±' + format(v['floor'] * 100, '.1f') + ' %':>13}" if v["floor"] is not None
                                      else f"{'n/a':>13}" for v in c["figures"].values()) + "  (noise floor)")
    if caps:
        print("Part 2 — client capacity on one core (emulator on the other, SSEMU_TOKEN_RATE=0)")
    for c in caps:
        mode = f"spec K=7 (AL {c['acceptance_length']:.2f} tok/chunk)" if c["speculative"] else "no spec (1 tok/chunk)"
        print(f"  {mode:<32} wall {c['wall_tok_s']:10,.0f} tok/s   client {c['tok_per_client_cpu_s']:10,.0f} "
              f"tok per CPU-s   {'OK' if c['meets_20k'] else 'BELOW 20,000'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
