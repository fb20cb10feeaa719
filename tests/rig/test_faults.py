"""Each fault mode, on the two-node rig: the lines vLLM would print, on the node where it prints them.

Every log produced here is also checked line by line against the vLLM 0.33 format table.
"""

from __future__ import annotations

import threading
import time

import pytest
import runner
from formats_033 import check
from scenario import cluster

pytestmark = pytest.mark.rig

FAST = {"VLLM_RINGBUFFER_WARNING_INTERVAL": "2", "SSEMU_PEER_TIMEOUT_S": "2", "SSEMU_NCCL_TIMEOUT_S": "2"}


def assert_real_formats(c) -> None:
    for n in c.rig.nodes:
        out, err = c.logs(n.name)
        _, bad = check(out, err)
        assert not bad, f"{n.name}: lines no vLLM 0.33 format produces:\n" + "\n".join(bad[:10])


def vllm_lines(text: str, needle: str) -> list[str]:
    return [ln for ln in text.splitlines() if needle in ln]


def request_in_background(c, max_tokens: int = 64) -> dict:
    box: dict = {}

    def go() -> None:
        try:
            box["result"] = runner.stream_completion(c.api_url, c.served, "hi", max_tokens=max_tokens, timeout=6)
        except Exception as e:  # noqa: BLE001  (a hang ends in a client timeout)
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    box["thread"] = t
    return box


def test_healthy_boot_prints_per_rank_evidence_on_each_node(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker) as c:
        c.wait_ready()
        a_out, a_err = c.logs("node-a")
        b_out, b_err = c.logs("node-b")
        assert vllm_lines(a_out, "(Worker_TP0_EP0 pid=") and not vllm_lines(a_out, "Worker_TP1")
        assert vllm_lines(b_out, "(Worker_TP1_EP1 pid=") and not vllm_lines(b_out, "Worker_TP0")
        for out, name in ((a_out, "Worker_TP0_EP0"), (b_out, "Worker_TP1_EP1")):
            mask = vllm_lines(out, "Loaded DFlash mask embedding for mask_token_id 154856 from mask_embedding.pt")
            assert len(mask) == 1 and f"({name} pid=" in mask[0]
            assert len(vllm_lines(out, "Graph capturing finished in")) == 1  # --kv-cache-memory-bytes: once
            assert len(vllm_lines(out, "(Worker pid=")) >= 2 and "Using V2 Model Runner" in out
        kv = vllm_lines(a_out, "KV cache size:")
        assert len(kv) == 1 and "(EngineCore pid=" in kv[0]
        pool = int(kv[0].split("KV cache size: ")[1].split(" tokens")[0].replace(",", ""))
        assert str(pool) in rig_clean.rig_yaml.read_text()  # gates.pool_tokens of rig.yaml
        assert "KV cache size" not in b_out and "APIServer" not in b_out and "EngineCore" not in b_out
        assert "(MainProcess pid=" in b_out and "headless multiproc executor" in b_out
        assert "Capturing CUDA graphs (PIECEWISE)" in a_err and "Capturing" not in b_err  # bars: rank 0 only
        assert "INFO:     Application startup complete." in a_err
        assert_real_formats(c)


def test_crash_at_boot_on_the_follower(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, env=FAST, node_env={"node-b": {"SSEMU_FAULTS": "crash_boot@rank=1"}}) as c:
        assert c.wait_exit("node-b") == 1
        b = c.text("node-b")
        assert "ERROR" in b and "[multiproc_executor.py:1057] WorkerProc failed to start." in b
        assert "RuntimeError: NCCL error: unhandled system error" in b
        assert c.wait_exit("node-a", timeout=30) == 1
        a = c.text("node-a")
        assert "(EngineCore pid=" in a and "EngineCore failed to start." in a
        assert "RuntimeError: Engine core initialization failed. See root cause above." in a
        assert "Watchdog caught collective operation timeout" in a
        assert "EngineCore" not in b
        assert_real_formats(c)


def test_crash_at_boot_on_the_head(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, env=FAST, node_env={"node-a": {"SSEMU_FAULTS": "crash_boot@rank=0"}}) as c:
        assert c.wait_exit("node-a") == 1
        a = c.text("node-a")
        assert "(Worker pid=" in a and "WorkerProc failed to start." in a and "NCCL error" in a
        assert "EngineCore failed to start." in a and "Engine core initialization failed" in a
        c.wait_log("node-b", "TCPStore.cpp")  # the follower lost its store: c10d warnings, no vLLM error
        assert c.status("node-b") == "running" and " ERROR " not in c.logs("node-b")[0]
        assert_real_formats(c)


def test_cuda_oom_on_the_follower_fails_the_head_through_the_rpc(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, env=FAST, node_env={"node-b": {"SSEMU_FAULTS": "oom@rank=1"}}) as c:
        assert c.wait_exit("node-a") == 1
        b = c.text("node-b")
        assert "WorkerProc hit an exception." in b and "torch.OutOfMemoryError: CUDA out of memory." in b
        a = c.text("node-a")
        assert "RuntimeError: Worker failed with error 'CUDA out of memory." in a
        assert "EngineCore failed to start." in a and "CUDA out of memory" not in a.split("Worker failed")[0]
        assert_real_formats(c)


def test_nccl_watchdog_on_the_follower(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, env=FAST, node_env={"node-b": {"SSEMU_FAULTS": "nccl_timeout@rank=1"}}) as c:
        c.wait_ready()
        req = request_in_background(c)
        c.wait_log("node-b", "Watchdog caught collective operation timeout", timeout=15)
        assert c.wait_exit("node-b", timeout=15) == 1
        b = c.text("node-b")
        assert "(MainProcess pid=" in b and "Worker proc VllmWorker-1 died unexpectedly (exit code: -6)" in b
        req["thread"].join(10)
        assert "error" in req  # the request hung on the head until the client gave up
        c.wait_log("node-a", "No available shared memory broadcast block found in 2 seconds", timeout=10)
        assert runner.http_get(c.api_url, "/health")[0] == 200
        assert " ERROR " not in c.logs("node-a")[0] and "Watchdog" not in c.text("node-a")
        assert_real_formats(c)


def test_dead_follower_leaves_the_head_healthy_and_requests_hanging(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, env=FAST) as c:
        c.wait_ready()
        _, usage, _ = runner.stream_completion(c.api_url, c.served, "hi", max_tokens=8)
        assert usage["completion_tokens"] == 8
        c.container("node-b").kill()
        time.sleep(1)
        req = request_in_background(c)
        req["thread"].join(10)
        assert "error" in req and "result" not in req
        assert runner.http_get(c.api_url, "/health")[0] == 200
        c.wait_log("node-a", "No available shared memory broadcast block found in 2 seconds", timeout=10)
        head = c.logs("node-a")[0]
        shm = vllm_lines(head, "No available shared memory broadcast block")
        assert all("(EngineCore pid=" in ln and " INFO " in ln for ln in shm)
        loud = [ln for ln in head.splitlines() if (" ERROR " in ln or " WARNING " in ln) and "MNNVL" not in ln]
        assert loud == []  # nothing louder than INFO
        assert_real_formats(c)


def test_graphs_silently_off_on_one_rank(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, node_env={"node-b": {"SSEMU_FAULTS": "graphs_off@rank=1"}}) as c:
        c.wait_ready()
        assert "Graph capturing finished" in c.text("node-a")
        b = c.text("node-b")
        assert "Graph capturing finished" not in b and "eager" not in b
        assert [ln for ln in b.splitlines() if " WARNING " in ln and "MNNVL" not in ln] == []
        assert_real_formats(c)


def test_worker_death_after_n_requests(rig_clean, rig_docker) -> None:
    faults = {"node-b": {"SSEMU_FAULTS": "worker_death@rank=1,after=2"}}
    with cluster(rig_clean, rig_docker, env=FAST, node_env=faults) as c:
        c.wait_ready()
        assert runner.stream_completion(c.api_url, c.served, "one", max_tokens=8)[1]["completion_tokens"] == 8
        req = request_in_background(c)
        assert c.wait_exit("node-b", timeout=15) == 1
        assert "Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor." in c.text("node-b")
        req["thread"].join(10)
        assert "error" in req
        assert_real_formats(c)


def test_worker_death_on_the_head_kills_the_engine(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, env=FAST, node_env={"node-a": {"SSEMU_FAULTS": "worker_death@rank=0"}}) as c:
        c.wait_ready()
        with pytest.raises(runner.RunnerError):
            runner.stream_completion(c.api_url, c.served, "x", max_tokens=32)
        a = c.text("node-a")
        assert "Worker proc VllmWorker-0 died unexpectedly (exit code: -9)" in a
        assert "EngineCore encountered a fatal error." in a and "RuntimeError: Executor failed." in a
        assert "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup" in a
        assert c.wait_exit("node-a", timeout=15) == 1
        assert_real_formats(c)


def test_stream_error_on_request_k(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, node_env={"node-a": {"SSEMU_FAULTS": "stream_error@request=2"}}) as c:
        c.wait_ready()
        assert runner.stream_completion(c.api_url, c.served, "a", max_tokens=16)[1]["completion_tokens"] == 16
        with pytest.raises(runner.RunnerError, match="InternalServerError"):
            runner.stream_completion(c.api_url, c.served, "b", max_tokens=16)
        assert runner.stream_completion(c.api_url, c.served, "c", max_tokens=16)[1]["completion_tokens"] == 16
        errs = vllm_lines(c.logs("node-a")[0], "failed with an internal error during generation")
        assert len(errs) == 1 and "(APIServer pid=" in errs[0] and " ERROR " in errs[0]
        assert_real_formats(c)


def test_slow_boot(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, env={"SSEMU_BOOT_SECONDS": "8"}) as c:
        t0 = time.monotonic()
        with pytest.raises(runner.RunnerError):
            c.wait_ready(timeout=3)
        c.wait_ready(timeout=30)
        assert time.monotonic() - t0 > 4


def test_mask_id_mismatch_fails_every_rank(rig_clean, rig_docker) -> None:
    over = {"drafter": {"path": rig_clean.models["drafter-badmask"]}}
    with cluster(rig_clean, rig_docker, overrides=over, env=FAST) as c:
        assert c.wait_exit("node-a") == 1
        msg = "ValueError: mask_embedding.pt mask_token_id does not match dflash_config.mask_token_id (154856). Got 5."
        for node in ("node-a", "node-b"):
            text = c.text(node)
            assert msg in text and "WorkerProc failed to start." in text
            assert "Loaded DFlash mask embedding" not in text
        assert "EngineCore failed to start." in c.text("node-a")
        assert_real_formats(c)


def test_drafter_without_mask_file_boots_silently(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, overrides={"drafter": {"path": rig_clean.models["drafter-nomask"]}}) as c:
        c.wait_ready()
        for node in ("node-a", "node-b"):
            assert "mask" not in c.logs(node)[0].lower().replace("mask_token_id", "")
        assert_real_formats(c)


def test_k_rule_dflash2_wedges_at_boot_above_block_minus_one(rig_clean, rig_docker) -> None:
    # block 8: K=8 cannot be drafted (K=5 boots: the drafter card, 2026-09-26)
    over = {"speculative": {"num_speculative_tokens": 8}}
    with cluster(rig_clean, rig_docker, overrides=over, env=FAST) as c:
        c.wait_log("node-b", "Capturing model for DFlash2 speculator...")
        with pytest.raises(runner.RunnerError):
            c.wait_ready(timeout=6)
        for node in ("node-a", "node-b"):
            out = c.logs(node)[0]
            assert c.status(node) == "running"
            assert " ERROR " not in out and "Graph capturing finished" not in out
        assert "Application startup complete." not in c.text("node-a")
        assert_real_formats(c)


def test_k_rule_dflash_v1_boots_with_any_k(rig_clean, rig_docker) -> None:
    over = {"drafter": {"path": rig_clean.models["drafter-v1"]}, "speculative": {"num_speculative_tokens": 5}}
    with cluster(rig_clean, rig_docker, overrides=over) as c:
        c.wait_ready()
        assert "Capturing model for DFlash speculator..." in c.text("node-b")
        assert runner.stream_completion(c.api_url, c.served, "x", max_tokens=8)[1]["completion_tokens"] == 8


def test_eager_and_gpu_memory_utilization_paths(rig_clean, rig_docker) -> None:
    over = {"serve": {"enforce_eager": True, "kv_cache_memory_bytes": None}}
    with cluster(rig_clean, rig_docker, overrides=over) as c:
        c.wait_ready()
        a, b = c.logs("node-a")[0], c.logs("node-b")[0]
        assert "(APIServer pid=" in vllm_lines(a, "Cudagraph is disabled under eager mode")[0]
        assert "(MainProcess pid=" in vllm_lines(b, "Cudagraph is disabled under eager mode")[0]
        for out in (a, b):
            assert "Graph capturing finished" not in out and "Available KV cache memory" in out
        assert "init engine (profile, create kv cache, warmup model) took" in a and "compilation:" not in a
        assert_real_formats(c)


def test_stats_lines_while_requests_run(rig_clean, rig_docker) -> None:
    env = {"VLLM_LOG_STATS_INTERVAL": "1", "SSEMU_TOKEN_RATE": "2000"}
    with cluster(rig_clean, rig_docker, env=env) as c:
        c.wait_ready()
        runner.stream_completion(c.api_url, c.served, "x", max_tokens=4000, ignore_eos=True)
        c.wait_log("node-a", "SpecDecoding metrics: Mean acceptance length:", timeout=5)
        line = vllm_lines(c.logs("node-a")[0], "SpecDecoding metrics")[0]
        assert "(APIServer pid=" in line and line.count(", 0.") + line.count(", 1.") >= 6  # 7 per-position rates
        assert_real_formats(c)


def test_faults_from_a_file_in_the_mounted_drafter_dir(rig_clean, rig_docker, pristine_models) -> None:
    b = rig_clean.nodes[1]
    (b.host_path(rig_clean.models["drafter"]) / "ssemu-faults").write_text("# node-b only\ngraphs_off@rank=1\n")
    with cluster(rig_clean, rig_docker) as c:
        c.wait_ready()
        assert "Graph capturing finished" in c.text("node-a")
        assert "Graph capturing finished" not in c.text("node-b")
