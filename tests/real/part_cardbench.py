"""The model card's bench protocol on the real engine (issue 21 item 5): `sparkserve bench --protocol card`
beside the independent minimal client (bench/card_reference_client.py), same server, same prompts.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/cardbench-dry \\
        --out /tmp/cardbench-dry/out --parts cardbench

After the scenario's boot and gates (tiny Qwen3 target with a chat template, DFlash K=7, vLLM 0.25.1 on the
GPU; the emulator in the dry run):

1. ``cardbench-prompts``: 20 prompts in the card's ``{"id", "source", "prompt"}`` shape (our own text);
2. ``cardbench-sparkserve``: ``sparkserve bench -c CFG --protocol card --cell smoke --size 20x4x128
   --prompts P --json`` — the chat template comes from ``model.target`` (the tiny target's tokenizer files),
   so the default lookup is exercised; the record must say protocol card, endpoint /v1/completions;
3. ``cardbench-reference``: the independent client, same URL, model, prompts, N, concurrency and
   max_tokens; it renders with transformers' ``apply_chat_template`` when the carried site has it;
4. ``cardbench-render``: how many of the 20 renderings are byte-identical between sparkserve's jinja2 and
   the reference's renderer (transformers on the GPU machine); and the two clients' figures side by side
   with their ratio (acceptance length, rate, per position, output tok/s), saved as
   ``results/cardbench.json``.

The tiny drafter is random: acceptance length is ~1.0 on real vLLM; what is compared is the two clients'
reading of the same server, not the drafter. On an H200 the tiny target decodes 20 × 128 tokens at c4 in a
few seconds; the reference and render steps also import transformers (~10 s on the GPU machine, ~50 s on
the 2-core VM of the dry run). Dry run (emulator, 2026-12-01): every step passed, 20/20 renderings identical
to transformers', sparkserve/reference AL 1.036, tok/s 0.93 (20 short requests: a 0.4 s wall).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "bench" / "card_reference_client.py"
N, C, T = 20, 4, 128
TOPICS = ["Evaluate the sum of the first {n} odd numbers.", "Write a function that reverses a list of {n} items.",
          "Explain how to style one dress for {n} occasions.", "Find all integer solutions of a^b = ab + {n}.",
          "Summarize the rules of a board game for {n} players."]

_RENDER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import card_reference_client as ref
from pathlib import Path
from sparkserve.measure.chat_template import load_chat_template
how, render = ref.render_with(sys.argv[2])
ours = load_chat_template(Path(sys.argv[2]))
rows = ref.load(sys.argv[3], int(sys.argv[4]))
same = [ours.render_user(r["prompt"]) == render(r["prompt"]) for r in rows]
print(json.dumps({"renderer": how, "identical": sum(same), "of": len(rows), "template": ours.source,
                  "first": ours.render_user(rows[0]["prompt"])}))
"""


class _Card:
    def __init__(self, s: Any) -> None:
        self.s = s
        self.prompts = s.work / "cardbench-holdout.jsonl"
        self.ours: dict[str, Any] | None = None
        self.theirs: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        from real_scenario import PORT

        return f"http://127.0.0.1:{PORT}"

    def write_prompts(self) -> None:
        with self.prompts.open("w") as f:
            for i in range(N):
                f.write(json.dumps({"id": f"cardbench-{i:03d}", "source": "sparkserve",
                                    "prompt": TOPICS[i % len(TOPICS)].format(n=i + 2)}) + "\n")
        self.s.say("cardbench-prompts", f"{N} prompts in the card's shape → {self.prompts}")

    def sparkserve(self) -> None:
        s = self.s
        p, took = s.sparkserve("cardbench-sparkserve", "bench", "-c", str(s.cfg), "--protocol", "card", "--cell",
                               "smoke", "--size", f"{N}x{C}x{T}", "--prompts", str(self.prompts), "--json",
                               timeout=300)
        try:
            d = json.loads(p.stdout)
        except ValueError:
            s.say("cardbench-sparkserve", f"rc={p.returncode}, no JSON: {p.stderr.strip()[-300:]}", ok=False)
            return
        (s.results / "cardbench-sparkserve.json").write_text(json.dumps(d, indent=1))
        self.ours = d
        ok = (p.returncode == 0 and d.get("ok") and d.get("protocol") == "card"
              and d.get("endpoint") == "/v1/completions" and d.get("requests_ok") == N)
        s.say("cardbench-sparkserve", f"{took:.1f}s, protocol {d.get('protocol')} {d.get('endpoint')}, "
              f"{d.get('requests_ok')}/{N} ok, {d.get('output_tokens')} tokens, {d.get('output_tok_s')} tok/s, "
              f"AL {d.get('acceptance_length')}, template {d.get('chat_template')}", ok=bool(ok),
              tok_s=d.get("output_tok_s"), al=d.get("acceptance_length"))

    def reference(self) -> None:
        s = self.s
        from real_scenario import MODEL

        p, took = s.run("cardbench-reference", [sys.executable, str(CLIENT), "--url", self.url, "--model", MODEL,
                                                "--prompts", str(self.prompts), "--tokenizer",
                                                str(s.models / "target"), "-n", str(N), "-c", str(C),
                                                "--max-tokens", str(T)], timeout=300)
        try:
            d = json.loads(p.stdout)
        except ValueError:
            s.say("cardbench-reference", f"rc={p.returncode}, no JSON: {p.stderr.strip()[-300:]}", ok=False)
            return
        (s.results / "cardbench-reference.json").write_text(json.dumps(d, indent=1))
        self.theirs = d
        s.say("cardbench-reference", f"{took:.1f}s, {d['ok']}/{N} ok, {d['output_tokens']} tokens, "
              f"{d['output_tok_s']:.1f} tok/s, AL {d['acceptance_length']}, renderer {d.get('renderer')}",
              ok=p.returncode == 0 and d["ok"] == N, tok_s=d["output_tok_s"], al=d["acceptance_length"])

    def compare(self) -> None:
        s = self.s
        p, _ = s.run("cardbench-render", [sys.executable, "-c", _RENDER, str(REPO / "bench"),
                                          str(s.models / "target"), str(self.prompts), str(N)], timeout=120)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            s.say("cardbench-render", f"rc={p.returncode}: {p.stderr.strip()[-300:]}", ok=False)
            return
        ours, theirs = self.ours or {}, self.theirs or {}

        def ratio(a: Any, b: Any) -> float | None:
            return round(a / b, 4) if isinstance(a, int | float) and isinstance(b, int | float) and b else None

        pp = [ratio(a, b) for a, b in zip(ours.get("per_position_acceptance") or [], theirs.get("per_position") or [],
                                          strict=False)]
        side = {
            "sparkserve": {k: ours.get(k) for k in ("acceptance_length", "acceptance_rate", "output_tok_s",
                                                    "output_tokens", "duration_s", "per_position_acceptance")},
            "reference": {k: theirs.get(k) for k in ("acceptance_length", "acceptance_rate", "output_tok_s",
                                                     "output_tokens", "wall_s", "per_position")},
            "ratio": {"acceptance_length": ratio(ours.get("acceptance_length"), theirs.get("acceptance_length")),
                      "acceptance_rate": ratio(ours.get("acceptance_rate"), theirs.get("acceptance_rate")),
                      "output_tok_s": ratio(ours.get("output_tok_s"), theirs.get("output_tok_s")),
                      "per_position": pp},
            "render": r,
        }
        (s.results / "cardbench.json").write_text(json.dumps(side, indent=1))
        q = side["ratio"]
        s.say("cardbench-render", f"{r['identical']}/{r['of']} renderings identical (sparkserve jinja2 vs "
              f"{r['renderer']}); sparkserve/reference: AL {q['acceptance_length']}, rate {q['acceptance_rate']}, "
              f"tok/s {q['output_tok_s']}, per position {pp}", ok=r["identical"] == r["of"], **side)


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    c = _Card(s)
    return [("cardbench-prompts", c.write_prompts, 1), ("cardbench-sparkserve", c.sparkserve, 60),
            ("cardbench-reference", c.reference, 60), ("cardbench-render", c.compare, 40)]
