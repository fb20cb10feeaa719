"""The ray executor on the rig: ``ray start`` on every node, ``vllm serve --distributed-executor-backend ray``
exec'd in the head's container; every rank's lines arrive on the head behind Ray's actor prefix (vllm-facts 1.5,
inferred for 0.31+), and a node that leaves the cluster fails the engine."""

from __future__ import annotations

import pytest
import runner
from formats_033 import check
from scenario import cluster

pytestmark = pytest.mark.rig
RAY = {"serve": {"executor": "ray"}}


def test_ray_boot_logs_every_rank_on_the_head(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, overrides=RAY) as c:
        c.wait_ready()
        assert runner.stream_completion(c.api_url, c.served, "x", max_tokens=8)[1]["completion_tokens"] == 8
        out, err = c.logs("node-a")
        b = rig_clean.nodes[1]
        remote = [ln for ln in out.splitlines() if f", ip={b.host}) (Worker_TP1_EP1 pid=" in ln]
        assert any("Loaded DFlash mask embedding" in ln for ln in remote)
        assert any("Graph capturing finished" in ln for ln in remote)
        local = [ln for ln in out.splitlines() if ln.startswith("(RayWorkerProc pid=") and "(Worker_TP0_EP0" in ln]
        assert local and ", ip=" not in local[0].split(")")[0]
        assert "No current placement group found. Creating a new placement group." in out
        assert c.logs("node-b") == ("", "")  # the follower only runs `ray start`
        _, bad = check(out, err)
        assert not bad, "\n".join(bad[:10])


def test_ray_node_loss_fails_the_engine(rig_clean, rig_docker) -> None:
    with cluster(rig_clean, rig_docker, overrides=RAY) as c:
        c.wait_ready()
        c.container("node-b").kill()
        c.wait_log("node-a", "RayWorkerProc rank=[1] died unexpectedly, shutting down executor.", timeout=10)
        c.wait_log("node-a", "EngineCore encountered a fatal error.")
        out, err = c.logs("node-a")
        _, bad = check(out, err)
        assert not bad, "\n".join(bad[:10])
