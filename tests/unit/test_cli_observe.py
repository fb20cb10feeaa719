"""`sparkserve logs analyze`, `sparkserve logs`, `sparkserve gates` as a user runs them: exit codes, stdout, stderr."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkserve import cli
from sparkserve.config import default_yaml_text
from sparkserve.deploy import gates_live as gates_live_mod  # imported by the command when it runs
from sparkserve.deploy import stack as stack_mod
from sparkserve.nodes import factory as factory_mod
from sparkserve.observe.gate_report import Evidence, GateReport, Verdict

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "fixtures" / "logs"
REAL = LOGS / "real-0.25.1"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
    e.update(HOME=str(home), COLUMNS="200", PYTHONPATH=str(REPO))
    return e


def sparkserve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkserve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=env["HOME"],
    )


# --- logs analyze --------------------------------------------------------------------------------------
def test_logs_analyze_json_on_the_real_head_and_follower(env: dict[str, str]) -> None:
    p = sparkserve("logs", "analyze", "--json", str(REAL / "A-head.log"), str(REAL / "A-follower.log"), env=env)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["kv_cache_tokens"] == [1677712] and j["graphs"] == "captured" and j["faults"] == []
    assert j["spec"]["mask_token_id"] == 4 and j["ranks"]["1"]["graphs"] == "captured"


def test_logs_analyze_human_output(env: dict[str, str]) -> None:
    p = sparkserve("logs", "analyze", str(LOGS / "fault-worker-oom-0.33-head.log"), env=env)
    assert p.returncode == 0, p.stderr
    assert "366,749 tokens" in p.stdout and "loaded (mask_token_id 154856)" in p.stdout
    assert "oom" in p.stdout and "torch.OutOfMemoryError: CUDA out of memory" in p.stdout


def test_logs_analyze_with_node_names(env: dict[str, str]) -> None:
    p = sparkserve(
        "logs", "analyze", "--json", "--node", f"spark-a={LOGS / 'fault-dead-follower-0.33-head.log'}", env=env
    )
    assert p.returncode == 0, p.stderr
    f = json.loads(p.stdout)["faults"]
    assert [x["kind"] for x in f] == ["timeout"] and f[0]["file"].endswith("fault-dead-follower-0.33-head.log")


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["logs", "analyze", "missing.log"], "error: FILE: missing.log: no such file"),
        (["logs", "analyze", "--node", "=x.log"], "error: --node: '=x.log' is not NAME=FILE"),
        (["logs", "analyze"], "error: logs analyze: give at least one FILE"),
    ],
)
def test_logs_analyze_bad_input_is_one_line_and_exit_2(env: dict[str, str], args: list[str], where: str) -> None:
    p = sparkserve(*args, env=env)
    assert p.returncode == 2 and p.stderr.startswith(where) and "Traceback" not in p.stderr


# --- gates --from-log --------------------------------------------------------------------------------
def from_log(head: str, follower: str) -> list[str]:
    return ["--from-log", f"spark-a={LOGS / head}", "--from-log", f"spark-b={LOGS / follower}"]


# the fixture logs are vLLM 0.33.0's: judged as the config's image says, here an image of that dialect
V033 = {"SPARKSERVE_SERVE__VLLM_VERSION": "0.33.0"}


def test_gates_from_log_healthy_but_smoke_and_identity_not_run(env: dict[str, str]) -> None:
    p = sparkserve("gates", "--json", *from_log("v0.33-head.log", "v0.33-follower.log"), env={**env, **V033})
    assert p.returncode == 1, p.stderr
    j = json.loads(p.stdout)
    assert {g["name"]: g["ok"] for g in j["gates"]} == {
        "pool": True,
        "graphs": True,
        "mask": True,
        "smoke": False,
        "faults": True,
        "runner": True,
        "signature": True,
        "identity": False,
    }
    assert "not checked (offline)" in next(g for g in j["gates"] if g["name"] == "faults")["reason"]


def test_gates_from_log_with_skips_passes(env: dict[str, str]) -> None:
    p = sparkserve(
        "gates",
        "--json",
        *from_log("v0.33-head.log", "v0.33-follower.log"),
        "--skip",
        "smoke",
        "--skip",
        "identity",
        env={**env, **V033},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    j = json.loads(p.stdout)
    assert j["ok"] is True
    assert next(g for g in j["gates"] if g["name"] == "smoke")["reason"].startswith("skipped")


def test_gates_from_log_eager_fails_graphs_with_evidence(env: dict[str, str]) -> None:
    p = sparkserve(
        "gates",
        *from_log("v0.33-head-eager.log", "v0.33-follower-eager.log"),
        "--skip",
        "smoke",
        "--skip",
        "identity",
        env=env,
    )
    assert p.returncode == 1
    assert "graphs" in p.stdout and "FAIL" in p.stdout and "Cudagraph is disabled under eager mode" in p.stdout
    assert "failed: graphs" in p.stdout


def test_gates_from_log_drafter_without_mask_file(env: dict[str, str], tmp_path: Path) -> None:
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    cfg = tmp_path / "sparkserve.yaml"
    text = default_yaml_text().replace("/models/GLM-5.3-Flash-DFlash2-E", str(drafter))
    assert str(drafter) in text
    cfg.write_text(text)
    p = sparkserve(
        "gates",
        "--json",
        "-c",
        str(cfg),
        *from_log("v0.33-head-nomask.log", "v0.33-follower-nomask.log"),
        "--skip",
        "smoke",
        "--skip",
        "identity",
        env=env,
    )
    assert p.returncode == 1, p.stderr
    mask = next(g for g in json.loads(p.stdout)["gates"] if g["name"] == "mask")
    assert not mask["ok"] and "has no mask_embedding.pt" in mask["reason"] and "rank 1" in mask["reason"]


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["gates", "--from-log", "a=x.log", "--bank"], "error: --bank: needs the running stack"),
        (["gates", "--skip", "pools"], "error: --skip: unknown gate 'pools'"),
        (["gates", "--from-log", "a=nope.log"], "error: --from-log: nope.log: no such file"),
        (["gates", "--from-log", "a=x.log", "--from-log", "a=y.log"], "error: --from-log: a node is named twice"),
    ],
)
def test_gates_bad_input_exit_2(env: dict[str, str], args: list[str], where: str) -> None:
    p = sparkserve(*args, env=env)
    assert p.returncode == 2 and p.stderr.startswith(where), p.stderr


# --- live paths (in-process: the node-side modules are replaced) --------------------------------------------
def main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["sparkserve", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        cli.main()
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def fake_report(ok: bool) -> GateReport:
    return GateReport(
        [
            Verdict("pool", True, {"config": 1}, [1], "1 tokens = gates.pool_tokens", [Evidence("spark-a", 3, "KV")]),
            Verdict(
                "faults",
                ok,
                {"faults": 0},
                {},
                "fine" if ok else "engine container not running on spark-b",
                [Evidence("spark-b", None, "engine container on spark-b is not running")],
            ),
        ]
    )


@pytest.fixture
def no_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """`open_nodes` replaced: no node is reached; records the node names of every open. The config is a
    file with hosts of its own (a command that reaches nodes refuses init's placeholder hosts)."""
    import yaml

    from sparkserve.config import default_yaml_text

    data = yaml.safe_load(default_yaml_text())
    for n in data["nodes"]:
        n["host"] = n["host"].replace(".lan", ".test")
    cfg = tmp_path / "sparkserve.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv("SPARKSERVE_CONFIG", str(cfg))
    opened: list[str] = []

    @contextlib.contextmanager
    def fake_open(cfg, **_: object):
        opened.extend(n.name for n in cfg.nodes)
        yield {}

    monkeypatch.setattr(factory_mod, "open_nodes", fake_open)
    return opened


@pytest.mark.parametrize(("ok", "code"), [(True, 0), (False, 1)])
def test_live_gates_call_gates_live_and_exit_by_verdict(monkeypatch, capsys, no_nodes, ok: bool, code: int) -> None:
    calls = []
    monkeypatch.setattr(
        gates_live_mod, "run_gates",
        lambda cfg, nodes, bank=False, skip=(), say=None: calls.append(bank) or fake_report(ok))
    rc, out, _ = main(monkeypatch, capsys, "gates", "--json", "--bank")
    assert rc == code and calls == [True] and no_nodes == ["spark-a", "spark-b"]
    assert json.loads(out)["ok"] is ok


def test_live_gates_skip_marks_the_live_verdict(monkeypatch, capsys, no_nodes) -> None:
    # the skips go to gates_live, which judges with them (and so never runs a skipped smoke cell)
    calls = []
    monkeypatch.setattr(
        gates_live_mod,
        "run_gates",
        lambda cfg, nodes, bank=False, skip=(), say=None: calls.append(skip) or fake_report(False).with_skipped(skip),
    )
    rc, out, _ = main(monkeypatch, capsys, "gates", "--skip", "faults")
    assert rc == 0 and calls == [("faults",)] and "skip" in out and "all gates passed" in out


def test_live_logs_stream_every_node(monkeypatch, capsys, no_nodes) -> None:
    calls = []
    monkeypatch.setattr(stack_mod, "stream_logs", lambda cfg, nodes, **kw: calls.append(kw))
    rc, _, _ = main(monkeypatch, capsys, "logs", "--node", "spark-b", "--follow", "--since", "10m")
    assert rc == 0 and calls == [{"node": "spark-b", "follow": True, "since": "10m", "tail": None}]


def test_live_logs_tail_n_reaches_the_stream(monkeypatch, capsys, no_nodes) -> None:
    calls = []
    monkeypatch.setattr(stack_mod, "stream_logs", lambda cfg, nodes, **kw: calls.append(kw))
    rc, _, _ = main(monkeypatch, capsys, "logs", "--tail", "50")
    assert rc == 0 and calls[0]["tail"] == 50 and calls[0]["follow"] is False


def test_ctrl_c_ends_logs_follow_quietly_with_exit_0(monkeypatch, capsys, no_nodes) -> None:
    import signal

    from sparkserve import interrupts

    def stream(cfg, nodes, **kw):  # a real SIGINT while streaming, as a person's Ctrl-C
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    monkeypatch.setattr(stack_mod, "stream_logs", stream)
    try:
        rc, out, err = main(monkeypatch, capsys, "logs", "-f")
        assert (rc, err) == (0, "")
        interrupts.reset()
        rc, out, err = main(monkeypatch, capsys, "logs")  # not following: an interrupt is still exit 3
        assert rc == 3 and err == "error: interrupted (SIGINT)\n"
    finally:
        interrupts.reset()


def test_logs_analyze_reads_stdin(env: dict[str, str]) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "sparkserve", "logs", "analyze", "--json", "-"],
        input=(LOGS / "v0.33-head.log").read_text(),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kv_cache_tokens"] == [366749]


def test_gates_from_log_never_loads_the_node_stack() -> None:
    """Judging saved files needs no node: docker and paramiko (0.3 s of start-up) stay unloaded."""
    log = REPO / "tests" / "fixtures" / "logs" / "real-0.25.1-gpu" / "boot1-up.log"
    code = ("import sys\nfrom sparkserve import cli\n"
            f"sys.argv = ['sparkserve', 'gates', '--from-log', {str(log)!r}]\n"
            "try:\n    cli.main()\n"
            "except SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('docker', 'paramiko') if m in sys.modules))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "LOADED []" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])


def test_gates_from_log_of_the_default_fork_image_require_its_signature(env: dict[str, str]) -> None:
    """The default image is the card's fork: vLLM 0.33.0 logs lack its signature lines, and the gate says so."""
    p = sparkserve("gates", "--json", *from_log("v0.33-head.log", "v0.33-follower.log"), "--skip", "smoke",
                   "--skip", "identity", env=env)
    assert p.returncode == 1, p.stderr
    sig = next(g for g in json.loads(p.stdout)["gates"] if g["name"] == "signature")
    assert sig["ok"] is False and "FLASHINFER_MLA_SPARSE_SM90" in sig["reason"]
    assert sig["expected"]["from"].startswith("vLLM 0.1.dev20051+g487ecf187")
