"""Throughput of `sparkserve logs analyze` on a generated 50 MB vLLM log, against `grep -c` on the same file.

    .venv/bin/python bench/bench_logs_analyze.py [--mb 50] [--keep PATH]

The log is the real vLLM 0.25.1 head boot (tests/fixtures/logs/real-0.25.1/A-head.log) followed by hours of
serving as vLLM writes it: uvicorn access lines, `Engine 000:` stats and `SpecDecoding metrics:` every 10 s,
now and then a JIT warning and an shm-broadcast stall, then the SIGINT shutdown. Prints MB/s for the
in-process analysis (parse + analyze + JSON, one core), for the CLI end to end, and for `grep -c` with
one fixed string and with every needle of the pattern table, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkserve.observe.logpatterns import NEEDLES  # noqa: E402
from sparkserve.observe.saved import LogFile, analyze_files  # noqa: E402

REAL = ROOT / "tests/fixtures/logs/real-0.25.1/A-head.log"


def generate(path: Path, target_bytes: int, seed: int = 7) -> int:
    rnd = random.Random(seed)
    lines = REAL.read_text(encoding="utf-8").splitlines(keepends=True)
    stop = next(i for i, line in enumerate(lines) if "[shutdown] API server: shutdown triggered" in line)
    boot, tail = lines[:stop], lines[stop:]
    size = 0
    with path.open("w", encoding="utf-8", newline="") as out:
        for line in boot:
            out.write(line)
            size += len(line.encode())
        h, m, s = 16, 38, 40
        n = 0
        tail_size = sum(len(x.encode()) for x in tail)
        while size < target_bytes - tail_size:
            n += 1
            s += 10
            if s >= 60:
                s -= 60
                m += 1
            if m >= 60:
                m -= 60
                h = (h + 1) % 24
            ts = f"11-29 {h:02d}:{m:02d}:{s:02d}"
            chunk = []
            for _ in range(rnd.randint(3, 8)):
                chunk.append(
                    f"(APIServer pid=3003) INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - "
                    f'"POST /v1/chat/completions HTTP/1.1" 200 OK\n'
                )
            gen = rnd.uniform(150, 300)
            chunk.append(
                f"(APIServer pid=3003) INFO {ts} [loggers.py:273] Engine 000: Avg prompt throughput: "
                f"{rnd.uniform(2, 20):.1f} tokens/s, Avg generation throughput: {gen:.1f} tokens/s, Running: 1 reqs, "
                f"Waiting: 0 reqs, GPU KV cache usage: {rnd.uniform(0, 3):.1f}%, Prefix cache hit rate: 0.0%\n"
            )
            al = rnd.uniform(2.5, 4.5)
            pos = ", ".join(f"{max(0.0, 0.9 - 0.1 * i):.3f}" for i in range(7))
            chunk.append(
                f"(APIServer pid=3003) INFO {ts} [metrics.py:120] SpecDecoding metrics: Mean acceptance length: "
                f"{al:.2f}, Accepted throughput: {gen * 0.6:.2f} tokens/s, Drafted throughput: {gen * 1.4:.2f} "
                f"tokens/s, Accepted: {int(gen * 6)} tokens, Drafted: {int(gen * 14)} tokens, Per-position acceptance "
                f"rate: {pos}, Avg Draft acceptance rate: {rnd.uniform(30, 60):.1f}%\n"
            )
            if n % 500 == 0:
                chunk.append(
                    f"(Worker_TP0 pid=3301) WARNING {ts} [jit_monitor.py:129] Triton kernel JIT compilation during "
                    "inference: _topk_topp_kernel. This causes a latency spike; consider extending warmup to cover "
                    "this shape/config.\n"
                )
            text = "".join(chunk)
            out.write(text)
            size += len(text.encode())
        for line in tail:
            out.write(line)
            size += len(line.encode())
    return size


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--keep", type=Path, help="write the generated log here and keep it")
    args = ap.parse_args()
    tmp = None
    if args.keep:
        path = args.keep
    else:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "big.log"
    size = generate(path, int(args.mb * 1e6))
    mb = size / 1e6

    result: dict = {}

    def run_inproc() -> None:
        result["json"] = analyze_files([LogFile(path)]).to_json()

    t_an = timed(run_inproc)
    t_cli = timed(
        lambda: subprocess.run(
            [sys.executable, "-m", "sparkserve", "logs", "analyze", "--json", str(path)],
            check=True,
            capture_output=True,
            cwd=ROOT,
        ),
        repeat=1,
    )
    t_grep = timed(lambda: subprocess.run(["grep", "-c", "KV cache size", str(path)], capture_output=True))
    with tempfile.NamedTemporaryFile("w", suffix=".needles", delete=False) as nf:
        nf.write("\n".join(NEEDLES) + "\n")
    try:
        t_grep_all = timed(
            lambda: subprocess.run(["grep", "-c", "-F", "-f", nf.name, str(path)], capture_output=True)
        )
    finally:
        os.unlink(nf.name)
    j = result["json"]
    print(
        f"log: {mb:.1f} MB, {sum(1 for _ in path.open('rb')):,} lines; "
        f"{len(j['spec']['mean_acceptance_length']):,} SpecDecoding lines, kv={j['kv_cache_tokens']}, "
        f"faults={len(j['faults'])}"
    )
    print(f"logs analyze (in-process, 1 core): {t_an:.2f} s = {mb / t_an:.1f} MB/s")
    print(f"logs analyze (CLI, --json, incl. interpreter start): {t_cli:.2f} s = {mb / t_cli:.1f} MB/s")
    print(f"grep -c 'KV cache size':               {t_grep:.3f} s = {mb / t_grep:.0f} MB/s")
    print(f"grep -c -F -f <{len(NEEDLES)} needles>:          {t_grep_all:.3f} s = {mb / t_grep_all:.0f} MB/s")
    print(
        f"ratio analyze/grep-one: {t_an / t_grep:.1f}x slower; analyze/grep-all-needles: {t_an / t_grep_all:.1f}x"
    )
    print(
        json.dumps(
            {
                "mb": round(mb, 1),
                "analyze_s": round(t_an, 3),
                "analyze_mb_s": round(mb / t_an, 1),
                "cli_s": round(t_cli, 3),
                "grep_s": round(t_grep, 4),
                "grep_all_s": round(t_grep_all, 4),
            }
        )
    )
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
