"""runtime: process without a rig: the node program run on this machine (a LocalNode), with small Python
programs as the engine — the manifest, liveness by pid and start time, the stop escalation, what is (and is
never) signalled, exec failures, one log per boot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from sparkserve.nodes import LocalNode, NodeError
from sparkserve.nodes.engine import NoSuchContainer
from sparkserve.nodes.process_remote import MARKER_ENV
from sparkserve.nodes.processes import ProcessEngine, rank_id
from sparkserve.plan.container import LABEL_FINGERPRINT, LABEL_RANK, ContainerSpec

FP = "ab12" * 16  # each test gets its own (_own_fingerprint): a rank's processes are found by its marker on the
# whole machine, so two tests with one fingerprint running at once (pytest -n, not loadfile) stopped each other's


@pytest.fixture(autouse=True)
def _own_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "FP", uuid.uuid4().hex * 2)
SECRET = "s3cr3t-api-key-value"

# engines: python programs that print, then behave as the test needs on SIGINT/SIGTERM
POLITE = ("import signal, sys, time\n"
          "signal.signal(signal.SIGINT, lambda *a: (print('got SIGINT', flush=True), sys.exit(3)))\n"
          "print('engine up', flush=True)\nwhile True: time.sleep(0.05)\n")
STUBBORN = ("import signal, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('engine up', flush=True)\nwhile True: time.sleep(0.05)\n")
TERM_ONLY = ("import signal, sys, time\n"
             "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
             "print('engine up', flush=True)\nwhile True: time.sleep(0.05)\n")
# the engine starts a child (as vLLM starts EngineCore) that ignores SIGINT and SIGTERM, then exits on SIGINT
WITH_CHILD = ("import signal, subprocess, sys, time\nsignal.signal(signal.SIGINT, lambda *a: sys.exit(0))\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import signal, time\\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
              "print(\\'child up\\', flush=True)\\nwhile True: time.sleep(0.05)'])\n"
              "print('engine up', child.pid, flush=True)\nwhile True: time.sleep(0.05)\n")


def spec(program: str, *, rank: int = 0, env: dict[str, str] | None = None) -> ContainerSpec:
    return ContainerSpec(node="local", host="local", rank=rank, role="head" if rank == 0 else "follower",
                         name=f"t-r{rank}-local", image="", command=["vllm", "-c", program],
                         env={"SOME_FLAG": "1", **(env or {})}, mounts=[],
                         labels={LABEL_FINGERPRINT: FP, LABEL_RANK: str(rank)}, shm_size=0,
                         secret_env={"VLLM_API_KEY": SECRET})


@pytest.fixture
def eng(tmp_path: Path):
    e = ProcessEngine(LocalNode("local"), run_dir=str(tmp_path / "run"), vllm=sys.executable)
    yield e
    for c in e.list_managed():  # nothing outlives a test
        e.stop_graceful(c.id, 1)


def wait_for(pred, timeout: float = 10.0) -> None:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "condition never held"
        time.sleep(0.05)


def logged(eng: ProcessEngine, rid: str, text: str) -> bool:
    return any(text in line for line in eng.logs(rid))


def manifest_of(tmp_path: Path, rank: int = 0) -> dict:
    return json.loads((tmp_path / "run" / FP[:16] / f"rank{rank}.json").read_text())


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
    except OSError:
        return False


def test_manifest_names_the_rank_its_pid_start_time_and_env_names_never_values(eng, tmp_path: Path) -> None:
    rid = eng.run(spec(POLITE))
    assert rid == rank_id(FP, 0) == f"{FP[:16]}-r0"
    wait_for(lambda: logged(eng, rid, "engine up"))
    m = manifest_of(tmp_path)
    stat = Path(f"/proc/{m['pid']}/stat").read_text().rsplit(") ", 1)[1].split()
    assert int(stat[19]) == m["start_time"] and int(stat[2]) == m["pgid"] != m["pid"]  # its own process group
    assert int(stat[3]) == m["pgid"]  # and its own session (setsid): it outlives whoever started it
    assert m["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert (m["fingerprint"], m["rank"], m["role"]) == (FP, 0, "head")
    assert m["argv"] == [sys.executable, "-c", POLITE]
    assert m["env_names"] == ["SOME_FLAG", "VLLM_API_KEY"]
    assert m["log"] == str(tmp_path / "run" / FP[:16] / "rank0.log")
    env = Path(f"/proc/{m['pid']}/environ").read_bytes().split(b"\0")
    assert f"VLLM_API_KEY={SECRET}".encode() in env  # the engine has the key ...
    assert f"{MARKER_ENV}={rid}".encode() in env
    for f in (tmp_path / "run").rglob("*"):  # ... no file of ours does
        assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f
    st = eng.state(rid)
    assert st.running and st.started_at.startswith(time.strftime("%Y-%m-%dT", time.gmtime()))
    (c,) = eng.list_managed()
    assert (c.id, c.rank, c.role, c.fingerprint, c.status) == (rid, 0, "head", FP, "running")


def test_a_reused_pid_is_not_the_rank_and_is_never_signalled(eng, tmp_path: Path) -> None:
    rid = eng.run(spec(POLITE))
    wait_for(lambda: logged(eng, rid, "engine up"))
    assert eng.stop_graceful(rid, 2) == ["SIGINT"]
    # the rank is gone; an unrelated process now holds a pid the manifest names
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = tmp_path / "run" / FP[:16] / "rank0.json"
        m = json.loads(path.read_text())
        other_start = int(Path(f"/proc/{other.pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
        m["pid"] = m["pgid"] = other.pid
        m["start_time"] = m["leader_start_time"] = other_start - 1  # same pid, another process
        path.write_text(json.dumps(m))
        assert not eng.state(rid).running
        assert [c.status for c in eng.list_managed()] == ["exited"]
        assert eng.stop_graceful(rid, 1) == []  # nothing of the rank lives: nothing is signalled
        assert other.poll() is None
        m["start_time"] = m["leader_start_time"] = other_start  # the very process: then it is the rank's
        path.write_text(json.dumps(m))
        assert eng.state(rid).running
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize(("program", "signals", "exit_code"), [
    (POLITE, ["SIGINT"], 3),
    (TERM_ONLY, ["SIGINT", "SIGTERM"], 0),
    (STUBBORN, ["SIGINT", "SIGTERM", "SIGKILL"], 128 + signal.SIGKILL),
], ids=["sigint", "sigterm", "sigkill"])
def test_stop_escalates_sigint_sigterm_sigkill_after_the_timeout(eng, program: str, signals: list[str],
                                                                 exit_code: int) -> None:
    rid = eng.run(spec(program))
    wait_for(lambda: logged(eng, rid, "engine up"))
    t0 = time.monotonic()
    assert eng.stop_graceful(rid, 1) == signals
    assert time.monotonic() - t0 < len(signals) + 3
    st = eng.state(rid)
    assert not st.running and st.exit_code == exit_code and st.finished_at
    eng.remove(rid)
    assert eng.list_managed() == []
    with pytest.raises(NoSuchContainer):
        eng.state(rid)


def test_stop_reaches_every_process_of_the_rank_and_down_leaves_none(eng, tmp_path: Path) -> None:
    rid = eng.run(spec(WITH_CHILD))
    wait_for(lambda: logged(eng, rid, "child up") and logged(eng, rid, "engine up"))
    line = next(x for x in eng.logs(rid) if x.startswith("engine up"))
    child = int(line.split()[-1])
    assert alive(child)
    signals = eng.stop_graceful(rid, 1)
    assert signals == ["SIGINT", "SIGTERM", "SIGKILL"]  # the engine left on SIGINT; its child needed SIGKILL
    assert not alive(child) and not alive(manifest_of(tmp_path)["pid"])
    eng.stop_and_remove(rid, timeout=1)  # idempotent
    assert not (tmp_path / "run" / FP[:16]).exists()


def test_a_running_rank_is_not_removed_and_a_second_start_is_refused(eng) -> None:
    rid = eng.run(spec(POLITE))
    with pytest.raises(NodeError, match="already runs on this node"):
        eng.run(spec(POLITE))
    with pytest.raises(NodeError, match="still running"):
        eng.remove(rid)
    assert eng.state(rid).running


def test_a_missing_executable_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    for vllm in (str(tmp_path / "no-such-vllm"), "no-such-vllm-on-path", str(tmp_path)):
        e = ProcessEngine(LocalNode("local"), run_dir=str(tmp_path / "run"), vllm=vllm)
        with pytest.raises(NodeError, match="no such executable on this node") as err:
            e.run(spec(POLITE))
        assert err.value.node_name == "local" and err.value.step_name == "run"
        assert e.list_managed() == []


def test_a_venv_directory_runs_its_bin_vllm(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport sys\nprint('venv vllm', sys.argv[1:], flush=True)\n")
    exe.chmod(0o755)
    e = ProcessEngine(LocalNode("local"), run_dir=str(tmp_path / "run"), vllm=str(venv))
    rid = e.run(spec(POLITE).model_copy(update={"command": ["vllm", "serve", "/m"]}))
    wait_for(lambda: not e.state(rid).running)
    assert list(e.logs(rid)) == ["venv vllm ['serve', '/m']"] and e.state(rid).exit_code == 0
    engine_id, what = e.identity()
    assert engine_id.startswith("sha256:") and what.startswith(str(exe))


def test_one_log_per_boot_stamped_when_first_seen(eng) -> None:
    rid = eng.run(spec(POLITE))
    wait_for(lambda: logged(eng, rid, "engine up"))
    (stamped,) = list(eng.logs(rid, timestamps=True))
    stamp, _, text = stamped.partition(" ")
    assert text == "engine up" and stamp.endswith("Z") and stamp.startswith(time.strftime("%Y-", time.gmtime()))
    eng.stop_graceful(rid, 2)  # returns once the last words are in the log
    assert list(eng.logs(rid)) == ["engine up", "got SIGINT"]
    eng.run(spec(POLITE))  # the next boot of the same rank starts a fresh log
    wait_for(lambda: logged(eng, rid, "engine up"))
    assert list(eng.logs(rid)) == ["engine up"]


def test_parity_facts_hash_env_values_on_the_node_and_read_argv_from_proc(eng) -> None:
    rid = eng.run(spec(POLITE, env={"VLLM_HOST_IP": "10.0.0.1"}))
    wait_for(lambda: logged(eng, rid, "engine up"))
    facts = eng.parity_facts(rid)
    assert facts["argv"] == [sys.executable, "-c", POLITE]
    env = facts["env"]
    assert isinstance(env, dict) and set(env) == {"SOME_FLAG"}  # per-node names and the key left out
    assert env["SOME_FLAG"] != "1" and len(env["SOME_FLAG"]) == 16
    assert facts["mounts"] == []


def test_the_node_program_signals_nothing_without_a_manifest(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, MARKER_ENV: f"{FP[:16]}-r0"})
    try:
        e = ProcessEngine(LocalNode("local"), run_dir=str(tmp_path / "run"), vllm=sys.executable)
        assert e.stop_graceful(f"{FP[:16]}-r0", 1) == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_each_line_is_stamped_when_it_arrived_not_when_it_was_read(eng) -> None:
    program = ("import time\nprint('first', flush=True)\ntime.sleep(1.0)\nprint('second', flush=True)\n"
               "time.sleep(60)\n")
    rid = eng.run(spec(program))
    time.sleep(1.6)  # one look after both lines were written
    fresh = ProcessEngine(eng.node, run_dir=eng.run_dir, vllm=eng.vllm)
    (a, b) = [line.partition(" ") for line in fresh.logs(rid, timestamps=True)]
    assert (a[2], b[2]) == ("first", "second")
    ta, tb = (datetime.fromisoformat(x[0].rstrip("Z") + "+00:00").timestamp() for x in (a, b))
    assert 0.8 < tb - ta < 1.5
    assert list(fresh.logs(rid, since=(ta + tb) / 2)) == ["second"]


def test_engine_for_picks_the_runtime_the_config_or_plan_names(tmp_path: Path) -> None:
    from _fixtures import config_file

    from sparkserve.config import load_config
    from sparkserve.nodes.engine import Engine
    from sparkserve.nodes.runtime import engine_for
    from sparkserve.plan.build import build_plan

    node = LocalNode("local")
    docker_cfg = load_config(config_file(tmp_path / "d.yaml"))
    proc_cfg = load_config(config_file(tmp_path / "p.yaml", {"runtime": "process", "serve": {"vllm": "/v"},
                                                             "process": {"run_dir": "/r"}}))
    assert type(engine_for(node, docker_cfg)) is Engine and type(engine_for(node, None)) is Engine
    assert type(engine_for(node, build_plan(docker_cfg))) is Engine
    for how in (proc_cfg, build_plan(proc_cfg)):
        e = engine_for(node, how)
        assert isinstance(e, ProcessEngine) and (e.run_dir, e.vllm) == ("/r", "/v")


def test_a_start_cut_short_is_still_stopped_by_its_manifest(tmp_path: Path) -> None:
    """The manifest is written before anything forks; a start that never recorded its pid (the starter was
    interrupted) still has its processes found by their marker and stopped."""
    rid = f"{FP[:16]}-r0"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, MARKER_ENV: rid})
    try:
        d = tmp_path / "run" / FP[:16]
        d.mkdir(parents=True)
        (d / "rank0.json").write_text(json.dumps({
            "id": rid, "fingerprint": FP, "rank": 0, "role": "head", "node": "local", "name": "t-r0-local",
            "labels": {}, "pid": -1, "pgid": -1, "start_time": -1, "leader_start_time": -1, "argv": [],
            "env_names": [], "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip()}))
        e = ProcessEngine(LocalNode("local"), run_dir=str(tmp_path / "run"), vllm=sys.executable)
        assert [c.status for c in e.list_managed()] == ["exited"]  # not running: `up` replaces it
        assert e.stop_graceful(rid, 1) == ["SIGINT"]
        orphan.wait(5)
        e.remove(rid)
        assert e.list_managed() == []
    finally:
        orphan.kill()
        orphan.wait()


def test_the_serving_drafter_of_a_process_rank_is_the_one_its_argv_names(eng) -> None:
    from sparkserve.nodes.runtime import serving_drafter

    spec_json = json.dumps({"method": "dflash", "model": "/models/d-abc123", "num_speculative_tokens": 7})
    s = spec(POLITE)
    rid = eng.run(s.model_copy(update={"command": [*s.command, "--speculative-config", spec_json]}))
    assert serving_drafter(eng, rid) == "/models/d-abc123"


def test_every_node_must_run_the_same_engine(monkeypatch, tmp_path: Path) -> None:
    from _fixtures import config_file

    from sparkserve.config import load_config
    from sparkserve.image.on_nodes import ensure_same_engine

    cfg = load_config(config_file(tmp_path / "c.yaml", {"runtime": "process"}))
    ids = {"a": ("sha256:" + "1" * 64, "/v/bin/vllm 0.25.1"), "b": ("sha256:" + "2" * 64, "/v/bin/vllm 0.33.0")}
    monkeypatch.setattr(ProcessEngine, "identity", lambda self, **kw: ids[self.node.name])
    with pytest.raises(NodeError) as e:
        ensure_same_engine(cfg, [LocalNode("a"), LocalNode("b")])
    assert e.value.node_name == "b" and e.value.step_name == "engine"
    assert "0.33.0" in e.value.what and "0.25.1" in e.value.what
    ids["b"] = ids["a"]
    assert ensure_same_engine(cfg, [LocalNode("a"), LocalNode("b")]) == ids["a"][0]


# The engine starts a child (as vLLM starts EngineCore) that, once its parent is gone, takes a while to exit (a GPU
# process releasing its memory: on the real engine one was gone 6 s after `kill -9` of the API server, issue 45).
# Its environ is cleared (env -i) as an exiting process's reads empty: the rank's marker can no longer find it;
# it ignores SIGINT and SIGTERM as a process deep in its exit does not hurry for them, and it closes its output
# first (the kernel closes a dying process's files in fd order: the log pipe before the GPU's device files), so the
# rank's supervisor sees the end of the log and exits while it is still there.
SLOW_EXIT = 3.0  # long beside the teardown's own steps before its stop (log saving: milliseconds)
WITH_SLOW_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen(['env', '-i', sys.executable, '-c', 'import os, signal, time\\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "parent = os.getppid()\\nprint(\\'child up\\', flush=True)\\n"
    "while os.getppid() == parent: time.sleep(0.02)\\n"
    f"os.close(1)\\nos.close(2)\\ntime.sleep({SLOW_EXIT})'])\n"
    "print('engine up', child.pid, flush=True)\nwhile True: time.sleep(0.05)\n")


def test_down_right_after_a_crash_waits_for_every_process_of_the_rank_and_names_it(tmp_path: Path, monkeypatch) -> None:
    from _fixtures import config_file

    from sparkserve.config import load_config
    from sparkserve.deploy.teardown import teardown

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    cfg = load_config(config_file(tmp_path / "p.yaml", {
        "runtime": "process", "serve": {"vllm": sys.executable}, "process": {"run_dir": str(tmp_path / "run")},
        "container": {"stop_timeout_s": 10}}))
    head = cfg.head.name
    eng = ProcessEngine(LocalNode(head), run_dir=str(tmp_path / "run"), vllm=sys.executable)
    rid = eng.run(spec(WITH_SLOW_CHILD))
    wait_for(lambda: logged(eng, rid, "child up") and logged(eng, rid, "engine up"))
    child = int(next(x for x in eng.logs(rid) if x.startswith("engine up")).split()[-1])
    os.kill(manifest_of(tmp_path)["pid"], signal.SIGKILL)  # the API server crashes; its child is still exiting
    said: list[str] = []
    t0 = time.monotonic()
    teardown(cfg, {head: LocalNode(head)}, {head: [rid]}, tag="down", say=said.append)
    assert not alive(child), "down returned while a process of the rank was still there"
    assert time.monotonic() - t0 < SLOW_EXIT + 5  # bounded: waited for it, not for a timeout
    (line,) = [s for s in said if "waited for" in s]
    assert line.startswith(f"{head}: waited for {rid}'s processes to be gone: pid {child} (python")
    assert not (tmp_path / "run" / FP[:16]).exists()  # and the rank was removed


# the engine exits at once; its child (vLLM's worker, which prints the traceback) holds the same stdout
LAST_WORDS_LATE = ("import subprocess, sys\n"
                   "subprocess.Popen([sys.executable, '-c', 'import time\\ntime.sleep(0.6)\\n"
                   "print(\\'RuntimeError: NCCL error: unhandled system error\\', flush=True)'])\n"
                   "print('engine up', flush=True)\nsys.exit(1)\n")


def test_a_stopped_rank_reads_stopped_only_once_its_last_words_are_in_the_log(eng) -> None:
    """The race that CI hit (a head crash at boot blamed with `exit code unknown` and no cause): the engine's pid
    was gone while its supervisor still relayed the worker's traceback. A rank reads stopped with its exit code
    and every line its processes wrote, as a stopped container does."""
    rid = eng.run(spec(LAST_WORDS_LATE))
    wait_for(lambda: not eng.state(rid).running)
    st = eng.state(rid)
    assert st.exit_code == 1 and st.finished_at, st
    assert list(eng.logs(rid)) == ["engine up", "RuntimeError: NCCL error: unhandled system error"]


def test_an_orphan_holding_the_output_delays_the_exit_status_two_seconds_at_most(eng) -> None:
    program = ("import subprocess, sys\n"
               "c = subprocess.Popen([sys.executable, '-c', 'import time\\ntime.sleep(3.5)\\n"
               "print(\\'orphan late\\', flush=True)\\ntime.sleep(60)'])\n"
               "print('engine up', c.pid, flush=True)\nsys.exit(4)\n")
    rid = eng.run(spec(program))
    wait_for(lambda: logged(eng, rid, "engine up"))
    orphan = int(next(ln for ln in eng.logs(rid) if ln.startswith("engine up")).split()[-1])
    try:
        t0 = time.monotonic()
        wait_for(lambda: eng.state(rid).exit_code is not None, timeout=8)
        assert time.monotonic() - t0 < 4.5  # the exit status does not wait for the orphan's EOF
        assert eng.state(rid).exit_code == 4 and not eng.state(rid).running
        wait_for(lambda: logged(eng, rid, "orphan late"))  # what it writes later still reaches the log
    finally:
        os.kill(orphan, signal.SIGKILL)
