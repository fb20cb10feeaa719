"""Docker on the rig's nodes through the SDK over each node's own SSH connection: one channel, image
identity and shipping, run/stop/remove of labelled containers only, logs, exec, rank parity facts."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator

import _nodes_rig
import docker
import pytest

from sparkserve.config import Config
from sparkserve.image.on_nodes import ensure_same_image, image_id
from sparkserve.image.ship import ship_image
from sparkserve.nodes import Node, NodeError, SSHNode
from sparkserve.nodes.docker_client import POOL_SIZE, docker_over_ssh
from sparkserve.nodes.engine import Engine, NotManaged
from sparkserve.plan.build import build_plan, parity_view
from sparkserve.plan.container import ContainerSpec, Mount

pytestmark = pytest.mark.rig
globals().update(_nodes_rig.FIXTURES)  # rig_cfg, rig_nodes, node_a, node_b, node_scratch

TEST_REPO = "sparkserve-h5test/img"
LOOP = ("trap 'echo got TERM; exit 0' TERM; echo booting; "
        "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done")


@pytest.fixture()
def cleanup(rig_nodes: dict[str, Node]) -> Iterator[list[tuple[Node, str, str]]]:
    """Things a test made by hand: (node, "container"|"image", id or name); removed after the test."""
    made: list[tuple[Node, str, str]] = []
    yield made
    for node, kind, ref in reversed(made):
        client = node.docker()
        try:
            if kind == "container":
                client.containers.get(ref).remove(force=True)  # test-made, never a GPU container
            else:
                client.images.remove(ref, force=True)
        except docker.errors.NotFound:
            pass


def _spec(cfg: Config, node_index: int, *, name: str, command: list[str] | None = None) -> ContainerSpec:
    """The plan's spec for a node, made runnable on the rig: a shell loop instead of the engine, and no
    unlimited memlock (this machine's hard limit forbids it)."""
    spec = build_plan(cfg).specs[node_index]
    return spec.model_copy(update={
        "name": name,
        "command": command or ["sh", "-c", LOOP],
        "ulimits": {"nofile": (4096, 4096)},
        "mounts": [Mount(source=f"{cfg.container.cache_root}/h5test", target="/cache", read_only=False)],
    })


def _commit(node: Node, base: str, tag: str, env: str) -> str:
    client = node.docker()
    c = client.containers.create(base, ["true"])
    try:
        img = c.commit(repository=TEST_REPO, tag=tag, changes=[f"ENV H5TEST={env}"])
    finally:
        c.remove()
    return str(img.id)


# -- the SDK over SSH ------------------------------------------------------------------------------------


def test_docker_calls_share_one_pooled_channel_on_every_node(rig_cfg: Config) -> None:
    for nc in rig_cfg.nodes:
        node = SSHNode(nc, rig_cfg.ssh)
        try:
            client = node.docker()
            transport = node.ssh_client().get_transport()
            assert transport is not None
            opened = 0
            real_open = transport.open_session

            def counting(*a: object, _real=real_open, **kw: object):  # type: ignore[no-untyped-def]
                nonlocal opened
                opened += 1
                return _real(*a, **kw)

            transport.open_session = counting  # type: ignore[method-assign]
            calls = itertools.cycle([
                client.version, client.info, client.ping, client.df,
                lambda c=client: c.containers.list(all=True), lambda c=client: c.images.list(),
                lambda c=client: c.images.get(rig_cfg.image.ref), lambda c=client: c.networks.list(),
                lambda c=client: c.volumes.list(),
            ])
            for _ in range(36):  # more distinct endpoints than sshd's default MaxSessions (10)
                next(calls)()
            assert opened <= 1, nc.name  # the channel opened at construction serves all 36 calls
            assert len(transport._channels.values()) <= POOL_SIZE, nc.name  # type: ignore[attr-defined]
        finally:
            node.close()


def test_docker_over_ssh_ignores_home_ssh_config(rig_cfg: Config, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh at all: key and known_hosts come from the config
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    node = SSHNode(rig_cfg.nodes[0], rig_cfg.ssh)
    try:
        client = docker_over_ssh(node)
        assert client.version()["ApiVersion"]
    finally:
        node.close()


# -- image identity and shipping ------------------------------------------------------------------------


def test_configured_image_has_one_id_on_every_node(rig_cfg: Config, rig_nodes: dict[str, Node]) -> None:
    nodes = [rig_nodes[n.name] for n in rig_cfg.nodes]
    same = ensure_same_image(nodes, rig_cfg.image.ref)
    assert same.startswith("sha256:")
    assert {image_id(n, rig_cfg.image.ref) for n in nodes} == {same}


def test_image_missing_on_a_node_names_it_and_suggests_ship(
    rig_cfg: Config, node_a: SSHNode, node_b: SSHNode, cleanup: list
) -> None:
    tag = uuid.uuid4().hex[:8]
    made = _commit(node_a, rig_cfg.image.ref, tag, "a")
    cleanup.append((node_a, "image", made))
    with pytest.raises(NodeError) as ei:
        ensure_same_image([node_a, node_b], f"{TEST_REPO}:{tag}")
    line = ei.value.line()
    assert line.startswith(f"error: {node_b.name}: image: image {TEST_REPO}:{tag} is not on this node")
    assert "sparkserve image ship" in line


def test_image_id_differing_between_nodes_is_refused(
    rig_cfg: Config, node_a: SSHNode, node_b: SSHNode, cleanup: list
) -> None:
    tag = uuid.uuid4().hex[:8]
    ida = _commit(node_a, rig_cfg.image.ref, tag, "a")
    cleanup.append((node_a, "image", ida))
    idb = _commit(node_b, rig_cfg.image.ref, tag, "b")
    cleanup.append((node_b, "image", idb))
    assert ida != idb
    with pytest.raises(NodeError, match=rf"^{node_b.name}: image: .* is {idb[7:19]} here but {ida[7:19]} on "
                       rf"{node_a.name}.*sparkserve image ship"):
        ensure_same_image([node_a, node_b], f"{TEST_REPO}:{tag}")


def test_ship_streams_save_into_load_and_keeps_tag_and_id(
    rig_cfg: Config, node_a: SSHNode, node_b: SSHNode, cleanup: list
) -> None:
    tag = uuid.uuid4().hex[:8]
    ref = f"{TEST_REPO}:{tag}"
    made = _commit(node_a, rig_cfg.image.ref, tag, "ship")
    cleanup.append((node_a, "image", made))
    cleanup.append((node_b, "image", made))
    assert image_id(node_b, ref) is None
    report = ship_image(node_a, node_b, ref)
    assert report.image_id == made and report.bytes > 0
    assert image_id(node_b, ref) == made  # tagged: save(named=True)
    assert ensure_same_image([node_a, node_b], ref) == made


def test_ship_of_an_image_the_source_lacks_names_the_source(node_a: SSHNode, node_b: SSHNode) -> None:
    with pytest.raises(NodeError, match=f"^{node_a.name}: ship: .*not on this node either"):
        ship_image(node_a, node_b, f"{TEST_REPO}:absent")


# -- containers -----------------------------------------------------------------------------------------


def test_run_list_logs_exec_then_graceful_stop_and_remove(rig_cfg: Config, node_b: SSHNode) -> None:
    eng = Engine(node_b)
    spec = _spec(rig_cfg, 1, name=f"sparkserve-h5test-{uuid.uuid4().hex[:6]}")
    cid = eng.run(spec)
    try:
        mine = [c for c in eng.list_managed() if c.id == cid]
        assert len(mine) == 1
        m = mine[0]
        assert (m.name, m.node, m.rank, m.role, m.running) == (spec.name, node_b.name, 1, "follower", True)
        attrs = node_b.docker().containers.get(cid).attrs
        host = attrs["HostConfig"]
        assert (host["NetworkMode"], host["IpcMode"], host["RestartPolicy"]["Name"]) == ("host", "host", "no")
        assert attrs["Config"]["StopTimeout"] == spec.stop_timeout  # the same spec `docker run` would get
        assert host["Memory"] == spec.memory == 118 * 2**30  # the card's --memory 118g
        # --shm-size 32g beside --ipc host, as the card's launcher renders it (docker ignores it under host IPC)
        assert spec.shm_size == 32 * 2**30 and host["IpcMode"] == "host"
        assert host["CapAdd"] == ["IPC_LOCK"]
        assert not host.get("DeviceRequests")  # container.gpus: none on the rig
        deadline = time.monotonic() + 10
        while "tick 3" not in eng.log_tail(cid, 50) and time.monotonic() < deadline:
            time.sleep(0.1)
        lines = eng.log_tail(cid, 50)
        assert lines[0] == "booting" and "tick 3" in lines
        assert eng.exec(cid, ["sh", "-c", "echo $H5X"], env={"H5X": "in-exec"}) .output == "in-exec\n"
        eng.exec(cid, ["echo", "said by exec"], detach=True, to_container_log=True)
        deadline = time.monotonic() + 5
        while "said by exec" not in eng.log_tail(cid, 200) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "said by exec" in eng.log_tail(cid, 200)
        followed = eng.logs(cid, follow=True, tail=1)
        got = list(itertools.islice(followed, 4))[1:]  # the tail line, then lines as they are printed
        ticks = [int(g.split()[1]) for g in got]
        assert ticks == sorted(ticks) and len(set(ticks)) == 3
        reader = threading.Thread(target=lambda: list(followed), daemon=True)
        reader.start()
        followed.cancel()  # from another thread, while the reader waits for the next line
        reader.join(5)
        assert not reader.is_alive() and node_b.docker().ping()  # the stream ended; docker still answers
        eng.stop_graceful(cid, timeout=10)
        st = eng.state(cid)
        assert (st.running, st.exit_code) == (False, 0)  # SIGTERM reached the trap: no SIGKILL needed
        assert eng.log_tail(cid, 1) == ["got TERM"]
    finally:
        eng.stop_and_remove(cid, timeout=5)
    eng.stop_and_remove(cid, timeout=5)  # already gone: teardown is idempotent
    assert eng.managed(cid) is None
    assert cid not in [c.id for c in eng.list_managed()]


def test_unlabelled_container_with_the_same_name_is_never_touched(
    rig_cfg: Config, node_b: SSHNode, cleanup: list
) -> None:
    eng = Engine(node_b)
    name = f"sparkserve-h5test-{uuid.uuid4().hex[:6]}"
    other = node_b.docker().containers.run(rig_cfg.image.ref, ["sleep", "300"], name=name, detach=True,
                                           network_mode="host")
    cleanup.append((node_b, "container", other.id))
    with pytest.raises(NodeError, match="exists that sparkserve did not start; it is left alone"):
        eng.run(_spec(rig_cfg, 1, name=name))
    with pytest.raises(NodeError, match=f"refusing to touch {name}"):
        eng.stop_graceful(name, timeout=1)
    with pytest.raises(NotManaged, match=f"refusing to touch {name}"):
        eng.stop_and_remove(name, timeout=1)
    with pytest.raises(NodeError, match=f"refusing to touch {name}"):
        eng.remove(name)
    with pytest.raises(NodeError, match=f"refusing to touch {name}"):
        eng.exec(name, ["true"])
    assert name not in [c.name for c in eng.list_managed()]
    other.reload()
    assert other.status == "running"


def test_missing_image_at_run_is_a_ship_hint_not_a_pull(rig_cfg: Config, node_b: SSHNode) -> None:
    spec = _spec(rig_cfg, 1, name=f"sparkserve-h5test-{uuid.uuid4().hex[:6]}")
    spec = spec.model_copy(update={"image": f"{TEST_REPO}:never"})
    with pytest.raises(NodeError, match=f"^{node_b.name}: run: image {TEST_REPO}:never is not on this node"):
        Engine(node_b).run(spec)


def test_parity_facts_match_across_ranks_and_catch_a_drifted_flag(
    rig_cfg: Config, node_a: SSHNode, node_b: SSHNode, cleanup: list
) -> None:
    suffix = uuid.uuid4().hex[:6]
    cmd = ["sh", "-c", LOOP, "vllm", "--max-num-seqs", "4"]
    sa = _spec(rig_cfg, 0, name=f"sparkserve-h5test-a-{suffix}", command=cmd)
    sb = _spec(rig_cfg, 1, name=f"sparkserve-h5test-b-{suffix}", command=cmd)
    assert sa.env["VLLM_HOST_IP"] != sb.env["VLLM_HOST_IP"]
    ea, eb = Engine(node_a), Engine(node_b)
    ca, cb = ea.run(sa), eb.run(sb)
    cleanup += [(node_a, "container", ca), (node_b, "container", cb)]
    fa, fb = ea.parity_facts(ca), eb.parity_facts(cb)
    assert fa == fb
    assert {k: fa[k] for k in parity_view(sa)} == parity_view(sa)  # comparable with the plan
    drift = sb.model_copy(update={"name": f"sparkserve-h5test-c-{suffix}",
                                  "command": ["sh", "-c", LOOP, "vllm", "--max-num-seqs", "8"]})
    cc = eb.run(drift)
    cleanup.append((node_b, "container", cc))
    fc = eb.parity_facts(cc)
    assert fc["argv"] != fa["argv"] and fc["env"] == fa["env"] and fc["image_id"] == fa["image_id"]
    for c, e in ((ca, ea), (cb, eb), (cc, eb)):
        e.stop_and_remove(c, timeout=2)
