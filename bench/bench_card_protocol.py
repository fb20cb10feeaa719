#!/usr/bin/env python3
"""`sparkserve bench --protocol card` beside an independent minimal client of the same protocol, one server.

Run (from the repository root, with the project venv)::

    .venv/bin/python bench/bench_card_protocol.py                      # the engine emulator on 127.0.0.1
    .venv/bin/python bench/bench_card_protocol.py --url http://127.0.0.1:8000 --model tiny \\
        --tokenizer /models/tiny --prompts holdout.jsonl -n 20 -c 4 --max-tokens 128   # any server

The anchor is bench/card_reference_client.py: written from the card's published protocol facts alone
(holdout_client.py as ../shared/docs/card-stack.md states them), standard library + jinja2/transformers,
no sparkserve import. Both clients get the same server, the same prompt file, the same first N prompts,
the same concurrency and max_tokens. They alternate (sparkserve first in odd rounds, the reference first
in even ones) for ``--rounds`` rounds; sparkserve runs as the command a user types (``sparkserve bench
--protocol card --cell smoke --size NxCxT --prompts … --chat-template … --url … --json``).

Printed: each run's figures; then both clients' means and their ratio (sparkserve / reference) for the
mean acceptance length, the draft-token acceptance rate, each position's acceptance and output tok/s; and
how many of the N rendered prompts are byte-identical between sparkserve's jinja2 rendering and the
reference's (transformers' ``apply_chat_template`` when transformers is importable, else its own jinja2).
Goal: acceptance ratios 1.00 within the draws' noise, tok/s within 3 %, every rendering identical.

Emulator mode (no ``--url``): the tiny target (tests/helpers/tiny_models.py) with the tiny Qwen3 chat
template of tests/real/gen_models.py, DFlash K=7, the default acceptance profile, requests that end at
EOS after a per-request length (``SSEMU_EOS_AFTER`` 40-200, so some reach max_tokens), streams paced at
``SSEMU_TOKEN_RATE`` tokens/s each. The emulator draws request n's acceptance and length from its seed and
n (the request's number since boot), so a fresh emulator per run (the default here) serves both clients
the very same draws: their token counts and acceptance figures must then agree exactly, and any
difference is the client's. ``--one-server`` keeps one emulator for every run (fresh draws each run).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import card_reference_client as ref  # noqa: E402

from sparkserve.measure.chat_template import load_chat_template  # noqa: E402

EMULATOR = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
TINY_MODELS = REPO / "tests" / "helpers" / "tiny_models.py"
MODEL = "glm-5.3-flash"
TINY_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}")
TOPICS = ["Evaluate the sum of the first {n} odd numbers.", "Write a function that reverses a list of {n} items.",
          "Explain how a slip dress works for casual and formal occasions ({n} tips).",
          "Find all integer solutions of a^b = ab + {n}.", "Summarize the rules of a game with {n} players."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def holdout_like(path: Path, n: int) -> None:
    """A prompt file in the card's shape ({"id", "source", "prompt"}), our own text."""
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"bench-{i:04d}", "source": "bench", "prompt": TOPICS[i % len(TOPICS)]
                                .format(n=i + 2)}) + "\n")


def make_models(work: Path) -> None:
    target, drafter = work / "target", work / "drafter"
    for kind, d in (("target", target), ("drafter", drafter)):
        subprocess.run([sys.executable, str(TINY_MODELS), kind, str(d)], check=True, capture_output=True)
    (target / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                              "chat_template": TINY_TEMPLATE}))


def start_emulator(work: Path, token_rate: float, eos: str) -> tuple[str, subprocess.Popen[bytes]]:
    target, drafter = work / "target", work / "drafter"
    port = free_port()
    spec = json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 7})
    env = {**os.environ, "SSEMU_BOOT_SECONDS": "0.3", "SSEMU_TOKEN_RATE": str(token_rate), "SSEMU_EOS_AFTER": eos}
    log = (work / "emulator.log").open("wb")
    proc = subprocess.Popen([sys.executable, str(EMULATOR), "serve", str(target), "--served-model-name", MODEL,
                             "--speculative-config", spec, "--seed", "11", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"emulator not ready: {(work / 'emulator.log').read_text()[-2000:]}")


def sparkserve_run(a: argparse.Namespace, journal: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "sparkserve", "bench", "--protocol", "card", "--cell", "smoke", "--size",
            f"{a.n}x{a.c}x{a.max_tokens}", "--prompts", a.prompts, "--chat-template", a.tokenizer, "--url", a.url,
            "--model", a.model, "--json"]
    env = {**os.environ, "SSJOURNAL_PATH": str(journal), "PYTHONPATH": str(REPO)}
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600, check=False)
    if p.returncode not in (0, 1) or not p.stdout.strip():
        raise SystemExit(f"sparkserve bench failed ({p.returncode}): {p.stderr[-2000:]}")
    d = json.loads(p.stdout)
    return {"acceptance_length": d["acceptance_length"], "acceptance_rate": d["acceptance_rate"],
            "per_position": d["per_position_acceptance"], "output_tok_s": d["output_tok_s"],
            "output_tokens": d["output_tokens"], "wall_s": d["duration_s"], "ok": d["requests_ok"],
            "refused": d["refused"], "protocol": d["protocol"], "endpoint": d["endpoint"]}


def reference_run(a: argparse.Namespace, rendered: list[str]) -> dict[str, Any]:
    return ref.run(a.url, a.model, rendered, a.c, a.max_tokens)


def _mean(runs: list[dict[str, Any]], key: str) -> float | None:
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.fmean(xs) if xs else None


def _pp(runs: list[dict[str, Any]]) -> list[float]:
    k = min((len(r["per_position"]) for r in runs), default=0)
    return [statistics.fmean(r["per_position"][p] for r in runs) for p in range(k)]


def _ratio(x: float | None, y: float | None) -> str:
    return "n/a" if x is None or not y else f"{x / y:.4f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running server (default: start the engine emulator on 127.0.0.1)")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--tokenizer", help="the target's tokenizer directory (its chat template)")
    ap.add_argument("--prompts", help="{id, prompt} JSONL (default: a holdout-shaped file of our own)")
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("-c", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--token-rate", type=float, default=400.0, help="emulator: tokens/s per stream")
    ap.add_argument("--eos", default="40-200", help="emulator: SSEMU_EOS_AFTER")
    ap.add_argument("--one-server", action="store_true", help="emulator: one server for every run")
    ap.add_argument("--json-out", help="write both clients' runs and the ratios here")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-card-"))
    proc = None
    fresh = a.url is None and not a.one_server
    if a.url is None:
        make_models(work)
        a.url, proc = start_emulator(work, a.token_rate, a.eos)
        a.tokenizer = str(work / "target")
    elif not a.tokenizer:
        ap.error("--url needs --tokenizer (the target's tokenizer directory)")
    if a.prompts is None:
        a.prompts = str(work / "holdout.jsonl")
        holdout_like(Path(a.prompts), a.n)
    a.url = a.url.rstrip("/")
    try:
        how, render = ref.render_with(a.tokenizer)
        rows = ref.load(a.prompts, a.n)
        rendered = [render(r["prompt"]) for r in rows]
        ours = load_chat_template(Path(a.tokenizer))
        same = sum(ours.render_user(r["prompt"]) == x for r, x in zip(rows, rendered, strict=True))
        print(f"server {a.url} · model {a.model} · {len(rows)} prompts × c{a.c} × {a.max_tokens} tokens · "
              f"{a.rounds} rounds · reference renders with {how}"
              + (" · a fresh emulator per run (the same draws for every run)" if fresh else ""))
        print(f"rendered prompts identical (sparkserve jinja2 vs reference {how}): {same}/{len(rows)}")
        runs: dict[str, list[dict[str, Any]]] = {"sparkserve": [], "reference": []}
        for rnd in range(a.rounds):
            order = ["sparkserve", "reference"] if rnd % 2 == 0 else ["reference", "sparkserve"]
            for who in order:
                if fresh and runs["sparkserve"] + runs["reference"]:
                    assert proc is not None
                    proc.terminate()
                    proc.wait(timeout=15)
                    a.url, proc = start_emulator(work, a.token_rate, a.eos)
                r = sparkserve_run(a, work / "journal.sqlite") if who == "sparkserve" else reference_run(a, rendered)
                runs[who].append(r)
                print(f"  round {rnd + 1} {who:10s} AL {r['acceptance_length']:.4f}  rate {r['acceptance_rate']:.4f}"
                      f"  {r['output_tokens']:6d} tok in {r['wall_s']:6.2f} s = {r['output_tok_s']:8.1f} tok/s  "
                      f"per-pos {' '.join(f'{x:.3f}' for x in r['per_position'])}")
        s, f = runs["sparkserve"], runs["reference"]
        summary = {
            "acceptance_length": (_mean(s, "acceptance_length"), _mean(f, "acceptance_length")),
            "acceptance_rate": (_mean(s, "acceptance_rate"), _mean(f, "acceptance_rate")),
            "output_tok_s": (_mean(s, "output_tok_s"), _mean(f, "output_tok_s")),
        }
        print(f"{'figure':28s} {'sparkserve':>12s} {'reference':>12s} {'ratio':>8s}")
        for k, (x, y) in summary.items():
            print(f"{k:28s} {x:12.4f} {y:12.4f} {_ratio(x, y):>8s}")
        ps, pf = _pp(s), _pp(f)
        for p, (x, y) in enumerate(zip(ps, pf, strict=False)):
            print(f"{'per-position ' + str(p):28s} {x:12.4f} {y:12.4f} {_ratio(x, y):>8s}")
        if a.json_out:
            Path(a.json_out).write_text(json.dumps({
                "server": a.url, "model": a.model, "prompts": a.prompts, "n": len(rows), "c": a.c,
                "max_tokens": a.max_tokens, "renderer": how, "renders_identical": same, "runs": runs,
                "means": {k: {"sparkserve": x, "reference": y} for k, (x, y) in summary.items()}
                | {"per_position": {"sparkserve": ps, "reference": pf}},
            }, indent=1))
        return 0 if same == len(rows) and all(not r["refused"] for r in s) and all(not r["fail"] for r in f) else 1
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)


if __name__ == "__main__":
    sys.exit(main())
