#!/usr/bin/env python3
"""The real-engine run of issue 13 item 4: sparkserve driving a real vLLM (or, for a dry run, the emulator).

    python3 tests/real/real_scenario.py --engine real --site /root/sparkserve-real/site --work W --out "$OUT"
    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/ss-dry --out /tmp/ss-dry/out

One local node, ``runtime: process``, ``serve.vllm_version`` = ``--vllm-version`` (0.25.1, 0.33.0, …; issue 43), tiny
real models (gen_models.py):

  validate → up → gates (every gate passes) → metrics → bench --cell smoke beside `vllm bench serve` (same
  server, same prompts) → swap-drafter to a second drafter (gates pass) → swap-drafter to a drafter without
  mask_embedding.pt (refused, exit 2, nothing changes) and to one missing a tensor (refused) → kill -9 of
  the EngineCore while a request streams → gates fails `faults` → down leaves no process.

``--probes`` instead runs three boots that must fail, straight through `vllm serve` (no sparkserve), and
`sparkserve logs analyze` on each log: a KV pool larger than the GPU (pool printed, then CUDA OOM), a
KV pool too small for max_model_len (ValueError), a misspelt speculative-config key (1 validation error).

Every step prints one line: UTC time, seconds since start, the step, its figure (and ``FAIL`` when it did
not do what the issue asks; the run goes on where it can). Everything is saved under ``--work``; ``--out``
receives at most 8 files (the device tool's limit): summary.json, scenario.log and one results.tar.gz.
With ``--engine emulator`` the EngineCore kill is a kill -9 of the emulator (one process) and the probes
are not run: the dry run checks the harness and sparkserve's process runtime, not vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EMULATOR = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
PORT = 18000
MODEL = "tiny"


class Scenario:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.real = args.engine == "real"
        self.work = Path(args.work).resolve()
        self.out = Path(args.out).resolve()
        # a parts run on a warm machine shares the work dir (its models, its compile cache's paths) with the
        # scenario before it, but not its results: each run its own results dir, log and saved boot logs
        tag = "-".join(x for x in args.parts.split(",") if x)
        self.results = self.work / (f"results-{tag}" if tag else "results")
        self.started = time.time()
        for d in (self.work, self.out, self.results, self.work / "bin", self.work / "state"):
            d.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.log_path = self.work / (f"scenario-{tag}.log" if tag else "scenario.log")
        self.log = self.log_path.open("a", buffering=1)
        self.summary: dict[str, Any] = {"engine": args.engine, "steps": {}, "failed": []}
        self.cfg = self.work / "sparkserve.yaml"
        self.part_down: Callable[[], None] | None = None  # a part with stacks of its own sets its down here
        self.models = self.work / "models"
        pypath = [str(REPO)] + ([args.site] if args.site else [])
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(pypath), "PYTHONUNBUFFERED": "1",
                    "XDG_STATE_HOME": str(self.work / "state"), "NO_COLOR": "1", "COLUMNS": "200"}

    # -- reporting ------------------------------------------------------------------------------------

    def say(self, step: str, figure: str, *, ok: bool = True, **data: Any) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        line = f"[{now} +{time.monotonic() - self.t0:7.1f}s] {step}: {figure}" + ("" if ok else "  FAIL")
        print(line, flush=True)
        self.log.write(line + "\n")
        self.summary["steps"][step] = {"ok": ok, "figure": figure, "t": round(time.monotonic() - self.t0, 1),
                                       **data}
        if not ok:
            self.summary["failed"].append(step)

    def run(self, step: str, argv: list[str], *, timeout: float, env: dict[str, str] | None = None,
            ) -> tuple[subprocess.CompletedProcess[str], float]:
        t = time.monotonic()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or self.env,
                               cwd=self.work)
        except subprocess.TimeoutExpired as e:
            p = subprocess.CompletedProcess(argv, 124, _text(e.stdout), _text(e.stderr) + f"\n(timeout {timeout}s)")
        took = time.monotonic() - t
        (self.results / f"{step}.out").write_text(f"$ {' '.join(argv)}\nrc={p.returncode} took={took:.1f}s\n"
                                                  f"--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}\n")
        return p, took

    def sparkserve(self, step: str, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
        return self.run(step, [sys.executable, "-m", "sparkserve", *args], timeout=timeout)

    # -- set-up ---------------------------------------------------------------------------------------

    def facts(self) -> None:
        info: dict[str, Any] = {"python": sys.version.split()[0]}
        with contextlib.suppress(Exception):
            import torch

            info["torch"] = torch.__version__
            info["cuda"] = torch.cuda.is_available() and torch.cuda.get_device_name(0)
        p, _ = self.run("facts-vllm", [str(self.launcher()), "--version"], timeout=120)
        info["vllm"] = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else f"rc={p.returncode}"
        self.say("facts", ", ".join(f"{k} {v}" for k, v in info.items()), ok=p.returncode == 0, **info)

    def launcher(self) -> Path:
        """serve.vllm: vLLM ``--vllm-version`` from the carried site (real), or the engine emulator (dry run)."""
        path = self.work / "bin" / "vllm"
        if self.real:  # pip --target wrote vLLM's own console script, its shebang this python
            # --site: one site, or a layered lane's own site first, then its base lane's (os.pathsep between)
            script = Path(self.args.site.split(os.pathsep)[0]) / "bin" / "vllm"
            main = "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())"
            run = f'{script} "$@"' if script.exists() else f'{sys.executable} -c "{main}" "$@"'
            body = (f"#!/bin/sh\n# vLLM {self.args.vllm_version} from the carried wheels (scripts/real-engine)\n"
                    f"export PYTHONPATH={self.args.site} PYTHONUNBUFFERED=1 PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1\n"
                    f"exec {run}\n")
        else:
            args_json = REPO / "sparkserve" / "data" / "vllm-0.33.0-serve-args.json"
            body = (f"#!/bin/sh\n# the sparkserve engine emulator (not vLLM): the dry run of tests/real\n"
                    f"export PYTHONUNBUFFERED=1 SSEMU_SERVE_ARGS={args_json}\n"
                    f'exec {sys.executable} {EMULATOR} "$@"\n')
        if not path.exists() or path.read_text() != body:
            path.write_text(body)
            path.chmod(0o755)
        return path

    def bench_client(self) -> list[str]:
        """`vllm bench serve`: the carried vLLM's own (real); the test venv's vLLM 0.33 client (dry run)."""
        if self.real:
            return [str(self.launcher()), "bench", "serve"]
        return [str(Path(sys.executable).parent / "vllm"), "bench", "serve"]

    def make_models(self) -> None:
        if (self.models / "drafter-missing" / "config.json").exists():
            self.say("models", f"reused {self.models}")
            return
        p, took = self.run("models", [sys.executable, str(HERE / "gen_models.py"), str(self.models)], timeout=300)
        ok = p.returncode == 0
        self.summary["models"] = json.loads(p.stdout.strip().splitlines()[-1]) if ok else None
        self.say("models", f"{took:.1f}s, {self.summary['models']}", ok=ok)
        if not ok:
            raise SystemExit(p.stderr[-3000:])

    def fake_sysfs(self) -> Path:
        """A one-node stack has no fabric, but `up`'s preflight resolves one: a loopback 'CX-7' (lo,
        RoCE v2 GID ::ffff:127.0.0.1) makes it resolve to lo (NCCL/GLOO over lo; TP 1 runs no collective)."""
        root = self.work / "sys"

        def w(p: Path, text: str) -> None:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text + "\n")

        for f, v in {"operstate": "up", "carrier": "1", "mtu": "9000", "type": "772"}.items():
            w(root / "class/net/lo" / f, v)
        port = root / "class/infiniband/loopback0/ports/1"
        for f, v in {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "Ethernet"}.items():
            w(port / f, v)
        (root / "class/infiniband/loopback0/device/net/lo").mkdir(parents=True, exist_ok=True)
        w(port / "gids/0", "0000:0000:0000:0000:0000:ffff:7f00:0001")
        w(port / "gid_attrs/types/0", "RoCE v2")
        w(port / "gid_attrs/ndevs/0", "lo")
        return root

    def write_config(self) -> None:
        import yaml

        mask = (self.summary.get("models") or {}).get("mask_token_id", 4)
        cfg = {
            "runtime": "process",
            "nodes": [{"name": "gpu", "host": "127.0.0.1", "fabric_ip": "127.0.0.1", "local": True, "gpus": 1}],
            "fabric": {"sysfs_root": str(self.fake_sysfs())},
            "image": {"ref": "none (runtime: process)"},
            "model": {"target": str(self.models / "target"), "served_name": MODEL},
            "drafter": {"path": str(self.models / "drafter")},
            "serve": {
                "vllm": str(self.launcher()), "vllm_version": self.args.vllm_version, "tensor_parallel_size": 1,
                "enable_expert_parallel": False, "max_model_len": 2048, "max_num_seqs": 16,
                # the tiny models are not GLM-5.3: none of the card's GLM parsers, its block size or its template
                "block_size": None, "tool_call_parser": None, "enable_auto_tool_choice": False,
                "reasoning_parser": None, "default_chat_template_kwargs": None,
                "kv_cache_dtype": "fp8_e4m3", "kv_cache_memory_bytes": "512MiB",
                "gpu_memory_utilization": 0.3,  # the start-up free-memory check runs even with KV bytes given
                "port": PORT, "ready_timeout_s": 420,
                "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_HOST_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"},
            },
            "speculative": {"num_speculative_tokens": 7},
            "gates": {"pool_tokens": None, "mask_token_id": mask,
                      "smoke": {"prompts": 20, "concurrency": 1, "max_tokens": 128}},
            "watchdog": {"memory_floor_bytes": "2GiB"},
            "process": {"run_dir": str(self.work / "run")},
        }
        self.cfg.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.say("config", f"{self.cfg} (runtime process, one local node, vllm_version {self.args.vllm_version}, "
                 f"GMU 0.3, "
                 f"KV 512 MiB, mask_token_id {mask})")

    # -- the scenario ---------------------------------------------------------------------------------

    def gates(self, step: str, *, want_ok: bool, must_fail: str | None = None) -> dict[str, Any]:
        p, took = self.sparkserve(step, "gates", "-c", str(self.cfg), "--json", timeout=300)
        try:
            d = json.loads(p.stdout)
        except json.JSONDecodeError:
            self.say(step, f"rc={p.returncode}, no JSON: {p.stderr.strip()[-300:]}", ok=False)
            return {}
        (self.results / f"{step}.json").write_text(json.dumps(d, indent=1))
        failed = [g["name"] for g in d["gates"] if not g["ok"]]
        figure = f"{took:.1f}s, {len(d['gates']) - len(failed)}/{len(d['gates'])} pass" + (
            f", failed: {', '.join(failed)}" if failed else "")
        ok = d["ok"] is want_ok
        if must_fail:
            g = next((g for g in d["gates"] if g["name"] == must_fail), {})
            ev = (g.get("evidence") or [{}])[0]
            figure += f"; {must_fail}: {g.get('reason', '')[:200]} | {str(ev.get('text', ''))[-200:]}"
            ok = ok and must_fail in failed
        self.say(step, figure, ok=ok, failed_gates=failed)
        return d

    def up(self) -> None:
        p, took = self.run("validate", [sys.executable, "-m", "sparkserve", "validate", "-c", str(self.cfg),
                                        "--offline", "--parser", "list"], timeout=120)
        self.say("validate", f"{took:.1f}s rc={p.returncode}: {_last(p.stdout)}", ok=p.returncode == 0)
        p, took = self.sparkserve("up", "up", "-c", str(self.cfg), timeout=560)
        boot = _after(p.stdout + p.stderr, "serving tiny at")
        self.say("up", f"{took:.1f}s wall, rc={p.returncode}, {boot or _last(p.stderr)}", ok=p.returncode == 0,
                 wall_s=round(took, 1))
        if p.returncode != 0:
            raise Abort("up failed")

    def metrics(self, name: str) -> None:
        import httpx

        with contextlib.suppress(httpx.HTTPError):
            text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=10).text
            (self.results / f"metrics-{name}.txt").write_text(text)
            spec = [ln for ln in text.splitlines() if ln.startswith("vllm:spec_decode_num_")]
            self.say(f"metrics-{name}", f"{len(text.splitlines())} lines, {len(spec)} spec_decode samples")
            return
        self.say(f"metrics-{name}", "/metrics did not answer", ok=False)

    def bench(self) -> None:
        # forced: the comparison below is `vllm bench serve --ignore-eos` (the card protocol: part_cardbench.py)
        p, took = self.sparkserve("bench", "bench", "-c", str(self.cfg), "--protocol", "forced", "--cell", "smoke",
                                  "--json", timeout=400)
        try:
            d = json.loads(p.stdout)
        except json.JSONDecodeError:
            self.say("bench", f"rc={p.returncode}: {_last(p.stderr)}", ok=False)
            return
        (self.results / "bench.json").write_text(json.dumps(d, indent=1))
        self.say("bench", f"{took:.1f}s, sparkserve: {d.get('output_tok_s')} tok/s, acceptance length "
                 f"{d.get('acceptance_length')}, {d.get('requests_ok')}/{d.get('prompts')} ok, "
                 f"{d.get('output_tokens')} tokens", ok=bool(d.get("ok")),
                 tok_s=d.get("output_tok_s"), al=d.get("acceptance_length"))
        from sparkserve.measure.prompts import builtin_prompts

        prompts = self.work / "smoke-prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": q.messages[-1]["content"]}) + "\n"
                                   for q in builtin_prompts().prompts))
        n, c, t = d.get("prompts", 20), d.get("concurrency", 1), d.get("max_tokens", 512)
        out = self.results / "vllm-bench.json"
        argv = [*self.bench_client(), "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
                "--base-url", f"http://127.0.0.1:{PORT}", "--model", MODEL, "--served-model-name", MODEL,
                "--tokenizer", str(self.models / "target"), "--dataset-name", "custom", "--dataset-path", str(prompts),
                "--disable-shuffle", "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos",
                "--temperature", "1.0", "--top-p", "0.95",
                "--chat-template-kwargs", json.dumps({"enable_thinking": True}),
                "--extra-body", json.dumps({"max_completion_tokens": t, "min_tokens": t}),
                "--num-warmups", "0", "--disable-tqdm", "--save-result", "--result-dir", str(out.parent),
                "--result-filename", out.name]
        env = {**self.env, "PYTHONPATH": self.args.site or ""} if self.real else dict(self.env)
        if os.environ.get("SCENARIO_BENCH_PYTHONPATH"):  # the dry run's pandas (the custom dataset needs it)
            env["PYTHONPATH"] = os.pathsep.join(x for x in (os.environ["SCENARIO_BENCH_PYTHONPATH"],
                                                            env["PYTHONPATH"]) if x)
        p, took = self.run("vllm-bench", argv, timeout=400, env=env)
        if p.returncode != 0 or not out.exists():
            self.say("vllm-bench", f"rc={p.returncode}: {_last(p.stderr)}", ok=False)
            return
        v = json.loads(out.read_text())
        self.say("vllm-bench", f"{took:.1f}s, vllm bench serve: {v.get('output_throughput'):.1f} tok/s, "
                 f"acceptance length {v.get('spec_decode_acceptance_length')}, {v.get('completed')} completed, "
                 f"{v.get('failed')} failed, {v.get('total_output_tokens')} tokens",
                 ok=not v.get("failed"), tok_s=v.get("output_throughput"), al=v.get("spec_decode_acceptance_length"))

    def swaps(self) -> None:
        p, took = self.sparkserve("swap-drafter", "swap-drafter", "-c", str(self.cfg),
                                  str(self.models / "drafter2"), timeout=560)
        self.say("swap-drafter2", f"{took:.1f}s rc={p.returncode}: {_last(p.stdout) or _last(p.stderr)}",
                 ok=p.returncode == 0, wall_s=round(took, 1))
        self.gates("gates-after-swap", want_ok=True)
        before = self.status()
        for name in ("drafter-nomask", "drafter-missing"):
            p, took = self.sparkserve(f"swap-{name}", "swap-drafter", "-c", str(self.cfg), str(self.models / name),
                                      timeout=300)
            line = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
            after = self.status()
            same = after == before and bool(before)
            self.say(f"swap-{name}", f"{took:.1f}s rc={p.returncode} (want 2), stack unchanged: {same}; {line}",
                     ok=p.returncode == 2 and same and line.startswith("error: "))

    def status(self) -> str:
        p, _ = self.sparkserve("status", "status", "-c", str(self.cfg), timeout=120)
        return "\n".join(ln for ln in p.stdout.splitlines() if not ln.startswith("up "))  # minus the uptime

    def manifests(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.work / "run").glob("*/rank*.json"))]

    def kill_engine_core(self) -> None:
        import httpx
        import psutil

        ranks = self.manifests()
        if not ranks:
            self.say("kill", "no rank manifest under the run dir", ok=False)
            return
        (self.results / "manifests.json").write_text(json.dumps(ranks, indent=1))
        rank = psutil.Process(ranks[-1]["pid"])
        got: dict[str, Any] = {"status": None, "error_event": False, "done": False, "chunks": 0}
        started = threading.Event()

        def stream() -> None:
            body = {"model": MODEL, "stream": True, "max_tokens": 1500, "min_tokens": 1500, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "Tell a long story."}]}
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{PORT}/v1/chat/completions", json=body,
                                  timeout=120) as r:
                    got["status"] = r.status_code
                    for line in r.iter_lines():
                        got["chunks"] += 1
                        if got["chunks"] >= 5:
                            started.set()
                        if line.startswith("data: ") and '"error"' in line:
                            got["error_event"] = True
                            got["error"] = line[:400]
                        if line.strip() == "data: [DONE]":
                            got["done"] = True
            except httpx.HTTPError as e:
                got["client_error"] = f"{type(e).__name__}: {e}"
            finally:
                started.set()

        th = threading.Thread(target=stream, daemon=True)
        th.start()
        started.wait(60)
        if self.real:
            cores = [p for p in rank.children(recursive=True) if "EngineCore" in _title(p)]
            victim = cores[0] if cores else None
        else:
            victim = rank  # the emulator is one process: kill -9 of it stands in for the EngineCore's
        if victim is None:
            self.say("kill", f"no VLLM::EngineCore under rank pid {rank.pid}", ok=False)
            return
        title = _title(victim)
        os.kill(victim.pid, signal.SIGKILL)
        th.join(90)
        (self.results / "kill-client.json").write_text(json.dumps(got, indent=1))
        self.say("kill", f"kill -9 {victim.pid} ({title[:40]}) after {got['chunks']} stream lines; client: HTTP "
                 f"{got['status']}, error event {got['error_event']}, [DONE] {got['done']}", kill=got)
        time.sleep(3 if self.real else 1)

    def down(self) -> None:
        pids = [r["pid"] for r in self.manifests()]
        p, took = self.sparkserve("down", "down", "-c", str(self.cfg), timeout=300)
        left = _ours_alive(pids, self.work)
        self.say("down", f"{took:.1f}s rc={p.returncode}, processes left: {len(left)} {left[:5]}",
                 ok=p.returncode == 0 and not left)

    # -- probes: boots that must fail (real vLLM only) ------------------------------------------------

    def probes(self) -> None:
        base = [str(self.launcher()), "serve", str(self.models / "target"), "--served-model-name", MODEL,
                "--kv-cache-dtype", "fp8_e4m3", "--enforce-eager"]
        spec = {"method": "dflash", "model": str(self.models / "drafter"), "num_speculative_tokens": 7}
        cases = {
            "kv-bigger-than-gpu": ["--max-model-len", "2048", "--kv-cache-memory-bytes", "300000000000",
                                   "--gpu-memory-utilization", "0.2", "--speculative-config", json.dumps(spec)],
            "kv-too-small": ["--max-model-len", "8192", "--kv-cache-memory-bytes", "2097152",
                             "--gpu-memory-utilization", "0.2", "--speculative-config", json.dumps(spec)],
            "spec-key-typo": ["--max-model-len", "2048", "--gpu-memory-utilization", "0.2", "--speculative-config",
                              json.dumps({**{k: v for k, v in spec.items() if k != "num_speculative_tokens"},
                                          "num_speculative_token": 7})],
        }
        env = {**self.env, "PYTHONPATH": self.args.site or "", "VLLM_USE_FLASHINFER_SAMPLER": "0",
               "VLLM_HOST_IP": "127.0.0.1"}
        procs = {}
        for i, (name, extra) in enumerate(cases.items()):
            log = (self.results / f"probe-{name}.log").open("w")
            argv = [*base, *extra, "--port", str(PORT + 10 + i)]
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
            procs[name] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True), time.monotonic())
        for name, (proc, t) in procs.items():
            try:
                rc = proc.wait(timeout=max(1.0, 240 - (time.monotonic() - t)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            p, _ = self.sparkserve(f"analyze-{name}", "logs", "analyze", str(self.results / f"probe-{name}.log"),
                                   "--json", timeout=120)
            try:
                a = json.loads(p.stdout)
            except json.JSONDecodeError:
                a = {}
            f0 = (a.get("faults") or [{}])[0]
            self.say(f"probe-{name}", f"{time.monotonic() - t:.0f}s rc={rc}; analyze: ready {a.get('ready')}, pool "
                     f"{a.get('kv_cache_tokens')}, first fault {f0.get('kind')}: {str(f0.get('text'))[-160:]}",
                     ok=rc != 0 and a.get("ready") is False, analysis=a)

    # -- collect --------------------------------------------------------------------------------------

    def collect(self) -> None:
        logs = self.results / "logs"
        logs.mkdir(exist_ok=True)
        saved = self.work / "state" / "sparkserve" / "logs"  # what sparkserve saved at each replace / down
        mine = sorted(p for p in saved.glob("*") if p.is_dir() and p.stat().st_mtime >= self.started) \
            if saved.exists() else []  # this run's boots only
        for i, d in enumerate(mine, 1):
            why = d.name.split("-", 2)[-1]  # boot1 = `up` (replaced by swap-drafter), boot2 = the one killed
            for f in sorted(d.glob("*.log")):
                shutil.copy2(f, logs / f"boot{i}-{why}-{f.name}")
        for m in self.manifests():  # still running (an aborted run): its live log
            if Path(m["log"]).exists():
                shutil.copy2(m["log"], logs / f"live-rank{m['rank']}.log")
        if self.cfg.exists():
            shutil.copy2(self.cfg, self.results / "sparkserve.yaml")
        with tarfile.open(self.out / "results.tar.gz", "w:gz") as tar:
            tar.add(self.results, arcname="results")
            for d in mine:
                tar.add(d, arcname=f"saved-logs/{d.name}")
        self.summary["wall_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))
        shutil.copy2(self.log_path, self.out / "scenario.log")
        size = (self.out / "results.tar.gz").stat().st_size
        self.say("collect", f"{self.out}: summary.json, scenario.log, results.tar.gz ({size / 2**20:.1f} MiB); "
                 f"failed steps: {self.summary['failed'] or 'none'}")


class Abort(Exception):
    """A step after which the rest cannot run."""


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _after(text: str, needle: str) -> str | None:
    return next((ln.strip() for ln in text.splitlines() if needle in ln), None)


def _title(p: Any) -> str:
    with contextlib.suppress(Exception):
        return " ".join(p.cmdline()) or p.name()
    return ""


def _ours_alive(pids: list[int], work: Path) -> list[str]:
    """Processes of this run still alive: a rank pid from a manifest, anything titled VLLM::, anything whose
    command line names the work dir."""
    import psutil

    left = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] == os.getpid():
            continue
        if p.info["pid"] in pids or (p.info["name"] or "").startswith("VLLM::") or cmd.startswith("VLLM::") \
                or (str(work) in cmd and "real_scenario.py" not in cmd):
            left.append(f"{p.info['pid']} {cmd[:80]}")
    return left


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["real", "emulator"], required=True)
    ap.add_argument("--site", help="where the carried wheels are installed (real); a layered lane (0.34.0 over "
                    "0.33.0): its own site, then the base's, joined by os.pathsep")
    ap.add_argument("--vllm-version", default="0.25.1",
                    help="the carried vLLM's version: serve.vllm_version in the config (issue 43: 0.25.1, 0.33.0)")
    ap.add_argument("--keep-up", action="store_true",
                    help="leave the stack up at the end (a next call on the warm machine goes on with --skip)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--probes", action="store_true", help="run the three failing boots instead of the scenario")
    ap.add_argument("--parts", default="",
                    help="comma-separated extra parts (tests/real/part_<name>.py, each `steps(s)`): boot, gates, "
                         "then each part's steps instead of the main scenario's")
    ap.add_argument("--skip", default="", help="comma-separated scenario steps to leave out (a second call)")
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds the run must be done by (0: none)")
    args = ap.parse_args()
    if args.engine == "real" and not args.site:
        ap.error("--engine real needs --site")
    s = Scenario(args)
    # (name, step, seconds it may take): a step that would run past --deadline is skipped, so that `down` and
    # the collection of results still happen inside the device call
    steps = [("facts", s.facts, 30), ("models", s.make_models, 60)]
    parts = [x for x in args.parts.split(",") if x]
    if args.probes:
        steps += [("probes", s.probes, 300)]
    elif parts:
        sys.path.insert(0, str(HERE))
        mods = [__import__(f"part_{name}") for name in parts]
        if not all(getattr(m, "OWN_STACK", False) for m in mods):  # a part with OWN_STACK boots its own stacks
            steps += [("config", s.write_config, 5), ("up", s.up, 240),
                      ("gates", lambda: s.gates("gates", want_ok=True), 60)]
        for m in mods:  # a part's own steps: tests/real/part_<name>.py defines steps(s) -> [(name, fn, takes)]
            steps += m.steps(s)
    else:
        steps += [("config", s.write_config, 5), ("up", s.up, 240),
                  ("gates", lambda: s.gates("gates", want_ok=True), 60), ("metrics", lambda: s.metrics("before"), 5),
                  ("bench", s.bench, 100), ("metrics", lambda: s.metrics("after"), 5), ("swaps", s.swaps, 240),
                  ("kill", s.kill_engine_core, 40),
                  ("gates-after-kill", lambda: s.gates("gates-after-kill", want_ok=False, must_fail="faults"), 40)]
    skip = {x for x in args.skip.split(",") if x}
    steps = [st for st in steps if st[0] not in skip]
    try:
        for name, step, takes in steps:
            if args.deadline and time.time() + takes + 40 > args.deadline:
                s.say(name, f"skipped: it may take {takes}s and the call ends in {args.deadline - time.time():.0f}s",
                      ok=False)
                continue
            step()
    except Abort as e:
        s.say("abort", str(e), ok=False)
    finally:
        if not args.probes and not args.keep_up:
            if s.part_down is not None:  # a part's own stacks (its steps set it) before the main one
                try:
                    s.part_down()
                except Exception as e:  # noqa: BLE001 — said, and the main down and the collection still run
                    s.say("part-down", f"{type(e).__name__}: {e}", ok=False)
            with contextlib.suppress(Exception):
                s.down()
        s.collect()
    return 1 if s.summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
