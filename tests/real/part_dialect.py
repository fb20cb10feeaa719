"""The engine's dialect read from a real vLLM (issue 21 item 2): ``docker/tools/image_facts.py --serve-dialect``,
the program `image verify` runs inside an image, run here with the real engine's own interpreter and site.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/dialect-dry \\
        --out /tmp/dialect-dry/out --parts dialect

``dialect-dump``: on the real machine (vLLM 0.25.1 from the carried site) the tool must build vLLM's own
`vllm serve` parser and dump it (``how: parser``, version 0.25.1), and its option list must equal the committed
0.25.1 list sparkserve ships as that dialect (help texts aside) — the same dump, made inside the engine. In the
dry run the engine is the emulator, which is no Python vLLM: the tool must fall back to the version the engine's
own ``vllm --version`` prints (``how: vllm --version``).

Device time: one import of vLLM's CLI modules (~20-40 s), no GPU work. Dry run (emulator, 2-core VM): passed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from real_scenario import REPO


def _strip(o: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in o.items() if k != "help"}


def dump(s: Any) -> None:
    env = dict(s.env)
    env["PATH"] = f"{s.work / 'bin'}:{env.get('PATH', '')}"  # `vllm` = the scenario's engine (serve.vllm)
    py = [sys.executable]
    if s.real:
        env["PYTHONPATH"] = s.args.site or ""
        env["VLLM_TARGET_DEVICE"] = "cuda"
    else:  # the emulator is no Python vLLM: no site-packages (this venv's vLLM), the tool falls back to the CLI
        env["PYTHONPATH"] = ""
        py.append("-S")
    s.launcher()  # writes work/bin/vllm
    p, took = s.run("dialect-dump", [*py, str(REPO / "docker" / "tools" / "image_facts.py"), "--serve-dialect"],
                    timeout=300, env=env)
    try:
        got = json.loads(p.stdout)
    except json.JSONDecodeError:
        s.say("dialect-dump", f"rc={p.returncode}, no JSON: {p.stderr.strip()[-300:]}", ok=False)
        return
    if s.real:
        committed = json.loads((REPO / "sparkserve" / "data" / "vllm-0.25.1-serve-args.json").read_text())["options"]
        options = (got.get("options") or {}).get("options") or []
        same = [_strip(o) for o in options] == [_strip(o) for o in committed]
        ok = got.get("how") == "parser" and got.get("vllm_version") == "0.25.1" and same
        s.say("dialect-dump", f"{took:.1f}s: how {got.get('how')}, vLLM {got.get('vllm_version')}, "
              f"{len(options)} options, equal to the committed 0.25.1 list: {same}"
              + (f"; error {got.get('error')}" if got.get("error") else ""), ok=ok, options=len(options))
    else:
        ok = got.get("how") == "vllm --version" and got.get("vllm_version") == "0.33.0"
        s.say("dialect-dump", f"{took:.1f}s: how {got.get('how')}, vLLM {got.get('vllm_version')} (the emulator's "
              f"CLI; {got.get('error')})", ok=ok)


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    return [("dialect-dump", lambda: dump(s), 60)]
