"""The demo (``scripts/demo``): the plan runs for real on the rig, twice.

1. The launcher — ``launch_dflash2_tp2.sh`` rendered from the same template as the committed one, for
   ``rig.yaml`` — runs on node-a over SSH: it starts the follower on node-b (its own ssh hop), then the head.
2. ``sparkserve render --json`` — the per-node container specs — started with the docker SDK on each node.

Each time: both containers run on their own node, the head becomes ready, a streamed completion comes back,
every container is removed. Exit 0 only when both runs succeed; on failure the containers' last log lines
are printed and everything is cleaned up anyway.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rig  # noqa: E402
import runner  # noqa: E402

REPO = HERE.parents[1]
COMMITTED_LAUNCHER = REPO / "launch_dflash2_tp2.sh"
GATE_LINES = ("KV cache size", "Loaded DFlash mask embedding", "Graph capturing finished", "Using V2 Model Runner",
              "Application startup complete.")


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def show_gate_lines(info: dict) -> None:
    for client_name, client in runner.node_clients(info).items():
        for c in client.containers.list(all=True, filters={"label": "io.sparkserve.managed=1"}):
            logs = c.logs().decode(errors="replace").splitlines()
            picked = [ln for ln in logs if any(g in ln for g in GATE_LINES)]
            say(f"{client_name}: {c.name} ({c.status})")
            for ln in picked:
                print(f"    {ln[:160]}")


def dump_failure(info: dict) -> None:
    for client_name, client in runner.node_clients(info).items():
        for c in client.containers.list(all=True, filters={"label": "io.sparkserve.managed=1"}):
            print(f"--- {client_name}: {c.name} ({c.status}), last lines:", file=sys.stderr)
            for ln in c.logs(tail=25).decode(errors="replace").splitlines():
                print(f"    {ln[:200]}", file=sys.stderr)


def memlock_note(info: dict) -> dict[str, int | None]:
    caps = runner.memlock_caps(info)
    capped = {k: v for k, v in caps.items() if v is not None}
    if capped:
        say(f"note: this machine caps RLIMIT_MEMLOCK ({sorted(set(capped.values()))[0]} bytes, no CAP_SYS_RESOURCE);"
            " the plan's `--ulimit memlock=-1:-1` is lowered to that for the rig run")
    return caps


def smoke(plan_url: str, served: str, t0: float) -> None:
    waited = runner.wait_ready(plan_url, timeout=90)
    say(f"head ready ({plan_url}) {time.monotonic() - t0:.1f}s after the first docker run (health wait "
        f"{waited:.1f}s)")
    text, usage, tps = runner.stream_completion(plan_url, served, "Explain speculative decoding in one line.",
                                                max_tokens=48, chat=True)
    say(f"streamed {usage.get('completion_tokens')} tokens ({tps:.0f} tok/s): {text.strip()[:100]!r}…")
    if not usage.get("completion_tokens"):
        raise runner.RunnerError("the stream returned no tokens")


def run_launcher(info: dict) -> None:
    cfg = info["rig_yaml"]
    head = rig.nodes_from_info(info)[0]
    out = Path(head.srv_dir) / "demo" / "launch_dflash2_tp2.sh"
    out.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([*runner.SPARKSERVE, "render", "--config", cfg, "--launcher", "-o", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    if p.returncode != 0:
        raise runner.RunnerError(f"sparkserve render --launcher failed: {p.stderr.strip()}")
    text = out.read_text()
    caps = memlock_note(info)
    cap = next((v for v in caps.values() if v is not None), None)
    if cap is not None:
        text = text.replace("--ulimit memlock=-1:-1", f"--ulimit memlock={cap}:{cap}")
        out.write_text(text)
    same = _template_lines(COMMITTED_LAUNCHER.read_text()) & _template_lines(text)
    say(f"launcher: {out.relative_to(head.srv_dir)} on {head.name} (same template as the committed "
        f"{COMMITTED_LAUNCHER.name}: {len(same)} identical logic lines)")
    node_path = f"{info['node_root']}/demo/launch_dflash2_tp2.sh"
    remote = (f"PATH={shlex.quote(info['ssh']['wrapper_dir'])}:$PATH "
              f"DRAFTER_HOST_PATH={shlex.quote(info['models']['drafter'])} bash {shlex.quote(node_path)}")
    ssh = [f"{info['ssh']['wrapper_dir']}/ssh", "-p", str(head.port), f"root@{head.host}", remote]
    t0 = time.monotonic()
    p = subprocess.run(ssh, capture_output=True, text=True, timeout=180)
    for ln in (p.stdout + p.stderr).splitlines():
        print(f"    {ln}")
    if p.returncode != 0:
        raise runner.RunnerError(f"the launcher exited {p.returncode}")
    plan = runner.render_plan(cfg)
    smoke(plan["api_url"], plan["served_name"], t0)
    show_gate_lines(info)


def _template_lines(text: str) -> set[str]:
    """Lines that do not depend on the config (hosts, names, paths, values): the launcher's logic."""
    skip = ("--", "-e ", "ARGV", "0)", "1)", "#", "DEFAULT_", "K=", "say \"all")
    return {ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(skip)}


def run_render_json(info: dict) -> None:
    plan = runner.render_plan(info["rig_yaml"])
    order = " then ".join(plan.get("start_order") or [])
    say(f"render --json: {len(plan['specs'])} ranks, start order {order}, api {plan['api_url']}")
    memlock_note(info)
    t0 = time.monotonic()
    started = runner.start_plan(info, plan)
    for s in started:
        say(f"{s.node}: started {s.name} ({s.id[:12]})")
    smoke(plan["api_url"], plan["served_name"], t0)
    show_gate_lines(info)


def main() -> int:
    info = rig.load_info()
    if not rig.status():
        print("error: rig: not every node is up (scripts/rig up)", file=sys.stderr)
        return 1
    with rig.exclusive_use():  # test processes using the rig wait meanwhile (and we never remove their stacks)
        return _run(info)


def _run(info: dict) -> int:
    ok = True
    for title, step in (("launcher", run_launcher), ("render --json", run_render_json)):
        say(f"--- {title} ---")
        runner.remove_managed(info)
        try:
            step(info)
        except (runner.RunnerError, subprocess.TimeoutExpired, OSError, json.JSONDecodeError) as e:
            print(f"error: demo ({title}): {e}", file=sys.stderr)
            dump_failure(info)
            ok = False
        finally:
            n = runner.remove_managed(info)
            say(f"removed {n} container(s)")
    say("demo passed" if ok else "demo FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
