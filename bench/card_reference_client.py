#!/usr/bin/env python3
"""A minimal, independent client of the model card's bench protocol — the anchor sparkserve's is held to.

Written from the protocol's published facts alone (the card's drafter/eval/holdout_client.py as
../shared/docs/card-stack.md describes it, "The bench protocol"); it imports nothing from sparkserve:

* the first N rows of a ``{"id", "prompt"}`` JSONL;
* each prompt rendered with the target's chat template: ``apply_chat_template([{"role": "user", "content":
  prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True)`` — through transformers'
  tokenizer when transformers is importable (what the card's client does), else with plain jinja2 set up as
  Hugging Face documents template rendering (sandboxed, trim_blocks, lstrip_blocks, loop controls);
* ``POST /v1/completions`` ``{"model", "prompt", "max_tokens", "temperature": 1.0, "top_p": 0.95}`` — no
  forced length; a fixed number of requests in flight (threads, one keep-alive connection each);
* ``/metrics`` read before and after; ``vllm:spec_decode_num_*`` counters summed over every label set;
* mean acceptance length 1 + accepted / drafts; rate accepted / draft_tokens; per position
  accepted_at_pos / drafts; output tok/s = Σ ``usage.completion_tokens`` / wall.

Standard library only, plus jinja2 or transformers for the rendering.

    python3 bench/card_reference_client.py --url http://127.0.0.1:8000 --model glm-5.3-flash \\
        --prompts prompts_holdout_500.jsonl --tokenizer /models/glm53-w4a16 -n 20 -c 4 --max-tokens 128
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

_LINE = re.compile(r"^(vllm:spec_decode_num_[A-Za-z_]+)(\{[^}]*\})?\s+(\S+)")
_POS = re.compile(r'position="(\d+)"')


def render_with(tokenizer_dir: str) -> tuple[str, Any]:
    """A function prompt → rendered text, and which renderer it is ("transformers" or "jinja2")."""
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError:
        AutoTokenizer = None  # noqa: N806
    if AutoTokenizer is not None:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)

        def hf(prompt: str) -> str:
            return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True, enable_thinking=True)
        return "transformers", hf
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    d = Path(tokenizer_dir)
    conf = json.loads((d / "tokenizer_config.json").read_text()) if (d / "tokenizer_config.json").exists() else {}
    src = (d / "chat_template.jinja").read_text() if (d / "chat_template.jinja").exists() else conf["chat_template"]
    if isinstance(src, list):
        src = {t["name"]: t["template"] for t in src}["default"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def fail(msg: str) -> None:
        raise ValueError(msg)

    env.globals["raise_exception"] = fail
    env.filters["tojson"] = lambda v, **kw: json.dumps(v, ensure_ascii=False, **kw)
    template = env.from_string(src)
    tokens = {}
    for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = conf.get(k)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            tokens[k] = v

    def j2(prompt: str) -> str:
        return template.render(messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
                               enable_thinking=True, **tokens)
    return "jinja2", j2


def metrics(url: str) -> dict[str, Any]:
    """The spec-decode counters, each summed over its label sets; per position by ``position``."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    m: dict[str, Any] = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}
    for line in text.splitlines():
        hit = _LINE.match(line)
        if not hit:
            continue
        name, labels, value = hit.group(1), hit.group(2) or "", float(hit.group(3))
        if name == "vllm:spec_decode_num_drafts_total":
            m["drafts"] += value
        elif name == "vllm:spec_decode_num_draft_tokens_total":
            m["draft_tokens"] += value
        elif name == "vllm:spec_decode_num_accepted_tokens_total":
            m["accepted"] += value
        elif name.startswith("vllm:spec_decode_num_accepted_tokens_per_pos"):
            p = _POS.search(labels)
            if p:
                m["per_pos"][int(p.group(1))] = m["per_pos"].get(int(p.group(1)), 0.0) + value
    return m


def run(url: str, model: str, rendered: list[str], concurrency: int, max_tokens: int,
        headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Send every rendered prompt, ``concurrency`` at a time, in order; the card's figures."""
    u = urlsplit(url)
    work: queue.Queue[tuple[int, str]] = queue.Queue()
    for i, p in enumerate(rendered):
        work.put((i, p))
    tokens = [0] * len(rendered)
    ok = [False] * len(rendered)
    errors: list[str] = []

    def worker() -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=1200)
        while True:
            try:
                i, prompt = work.get_nowait()
            except queue.Empty:
                break
            body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0,
                               "top_p": 0.95})
            try:
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json", **(headers or {})})
                reply = json.loads(conn.getresponse().read())
                tokens[i] = int(reply["usage"]["completion_tokens"])
                ok[i] = True
            except Exception as e:  # noqa: BLE001  (a failed request is counted, as the card's client does)
                errors.append(f"{i}: {e}")
                conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=1200)
        conn.close()

    before = metrics(url)
    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    after = metrics(url)
    drafts = after["drafts"] - before["drafts"]
    dtok = after["draft_tokens"] - before["draft_tokens"]
    acc = after["accepted"] - before["accepted"]
    per_pos = {p: after["per_pos"][p] - before["per_pos"].get(p, 0.0) for p in sorted(after["per_pos"])}
    out = sum(tokens)
    return {
        "prompts": len(rendered), "ok": sum(ok), "fail": len(errors), "errors": errors[:5],
        "concurrency": concurrency, "max_tokens": max_tokens, "wall_s": wall, "output_tokens": out,
        "output_tok_s": out / wall if wall > 0 else 0.0, "drafts": drafts, "draft_tokens": dtok, "accepted": acc,
        "acceptance_length": 1 + acc / drafts if drafts else None,
        "acceptance_rate": acc / dtok if dtok else None,
        "per_position": [v / drafts for v in per_pos.values()] if drafts else [],
    }


def load(prompts: str, n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in Path(prompts).read_text().splitlines() if line.strip()]
    return rows[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--tokenizer", required=True, help="the target's tokenizer directory")
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("-c", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=1024)
    a = ap.parse_args()
    how, render = render_with(a.tokenizer)
    rendered = [render(r["prompt"]) for r in load(a.prompts, a.n)]
    res = run(a.url.rstrip("/"), a.model, rendered, a.c, a.max_tokens)
    res["renderer"] = how
    json.dump(res, sys.stdout, indent=1)
    print()
    return 0 if res["fail"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
