"""`sparkserve setup` and `sparkserve weights` on a rig of their own with a real fabric (tests/rig/rig.py:
fabric_up — veth ports named as a Spark's ConnectX-7 netdevs, in network namespaces of the rig's own, through
the rig's switch namespace; the f0 ports have no cable). Four nodes, 127.0.0.60-63, port 2240. node-a/b go
from bare to serving — setup on the hosts alone (the rig's fabric range, FABRIC), the weights pulled from a local
Hugging Face endpoint (tests/helpers/hf_endpoint.py; huggingface_hub itself runs on the head), shipped over the
fabric, validate, up — after setup's own tests on them; node-c/d take the tests that need a pair of their own.

Every node's /etc is an overlay of its own (what setup writes never reaches this machine); the tests compare
each node's ports (``ip -j addr`` in its fabric namespace) and its /etc before and after.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import rig as riglib

REPO = Path(__file__).resolve().parents[2]
RIG_PY = Path(__file__).resolve().parent / "rig.py"
sys.path.insert(0, str(REPO / "tests" / "helpers"))
from hf_endpoint import HFEndpoint  # noqa: E402

# A rig of its own (four nodes, sshd and dockerd each, ~30 s to come up): not `rig` (it never touches the shared
# rigs, so it runs in scripts/test's third process, beside them), but not what `--quick` means by "needs no rig".
pytestmark = pytest.mark.ownrig

IP_BASE, PORT = 60, 2240  # a rig of this module's own: not marked `rig`, so it never waits for the shared one
FABRIC = f"127.{IP_BASE + 1}.0.0/16"  # rig.py FABRIC_RANGE: loopback's range, so the engines reach the fabric IPs


class FabricRig:
    def __init__(self, d: Path, env: dict[str, str]) -> None:
        self.d, self.env = d, env

    def hosts(self, *idx: int) -> list[str]:
        return [f"127.0.0.{IP_BASE + i}:{PORT}" for i in idx]

    @property
    def ssh(self) -> list[str]:
        return ["--ssh-config", str(self.d / "ssh" / "config"), "--known-hosts", str(self.d / "ssh" / "known_hosts")]

    def node_dir(self, i: int) -> Path:
        return self.d / "nodes" / f"node-{'abcd'[i]}"

    def pid(self, i: int, name: str) -> int:
        return int((self.node_dir(i) / name).read_text().split()[0])

    def fabric(self, i: int, *argv: str) -> str:
        return subprocess.run(["nsenter", f"--net=/proc/{self.pid(i, 'fabric.pid')}/ns/net", "--", *argv],
                              capture_output=True, text=True, check=True).stdout

    def ports(self, i: int) -> dict:
        out = {}
        for link in json.loads(self.fabric(i, "ip", "-j", "addr", "show")):
            addrs = sorted((a["family"], a["local"], a["prefixlen"]) for a in link.get("addr_info", []))
            out[link["ifname"]] = (link["mtu"], link["operstate"], addrs)
        return out

    def etc(self, i: int) -> list[str]:
        p = subprocess.run(["nsenter", f"--mount=/proc/{self.pid(i, 'ns.pid')}/ns/mnt", "--", "find", "/etc",
                            "-printf", "%p %y %s %m\n"], capture_output=True, text=True)
        return sorted(p.stdout.splitlines())

    def state(self, *idx: int) -> dict:
        return {i: (self.ports(i), self.etc(i)) for i in idx}

    def host_path(self, i: int, node_path: str) -> Path:
        return self.node_dir(i) / "srv" / Path(node_path).relative_to("/srv/spark")


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "sparkserve", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def frig():
    d = Path(tempfile.mkdtemp(prefix="ssrig40-", dir="/var/tmp"))
    env = {**os.environ, "SSRIG_DIR": str(d), "SSRIG_IP_BASE": str(IP_BASE), "SSRIG_SSH_PORT": str(PORT),
           "SSRIG_CACHE": str(riglib.CACHE_DIR)}
    try:
        p = subprocess.run([sys.executable, str(RIG_PY), "up", "--nodes", "4"], env=env,
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            pytest.fail(f"the fabric rig cannot come up: {p.stderr[-2000:]}", pytrace=False)
        r = FabricRig(d, env)
        for i in range(4):  # never run setup on a node whose /etc is this machine's
            mounts = Path(f"/proc/{r.pid(i, 'ns.pid')}/mountinfo").read_text()
            assert any(x.split()[4] == "/etc" and " overlay " in x for x in mounts.splitlines())
        yield r
    finally:
        subprocess.run([sys.executable, str(RIG_PY), "down", "--purge"], env=env, capture_output=True, timeout=300)
        subprocess.run(["rm", "-rf", str(d)], check=False)


def test_discovery_on_two_and_four_nodes_is_read_only_and_names_the_cable_to_check(frig, tmp_path):
    before = frig.state(0, 1, 2, 3)
    p = cli("setup", *frig.hosts(0, 1), *frig.ssh, "--fabric-range", "10.60.0.0/16", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    two = json.loads(p.stdout)
    a, b = (n["name"] for n in two["nodes"])
    links = {(x["node"], x["port"], x["peer"], x["peer_port"]) for x in two["links"]}
    assert links == {(a, t, b, t) for t in ("enp1s0f1np1", "enP2p1s0f1np1")} | {
        (b, t, a, t) for t in ("enp1s0f1np1", "enP2p1s0f1np1")}
    port = next(x for x in two["nodes"][0]["ports"] if x["name"] == "enp1s0f1np1")
    assert port["link"] and port["speed_mbps"] == 10000 and port["mac"] == f"4c:bb:47:{IP_BASE:02x}:00:01"
    assert {(x["node"], x["port"]) for x in two["unlinked"]} == {(n, q) for n in (a, b)
                                                                 for q in ("enp1s0f0np0", "enP2p1s0f0np0")}
    assert all("check the cable in QSFP port 2" in x["hint"] for x in two["unlinked"])
    assert two["config"]["fabric_ip"] == {a: "10.60.0.10", b: "10.60.0.11"}
    assert "docker" in two["nodes"][0] and two["nodes"][0]["swappiness"].isdigit()

    p = cli("setup", *frig.hosts(0, 1, 2, 3), *frig.ssh, "--fabric-range", "10.60.0.0/16", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "no link on enp1s0f0np0: check the cable in QSFP port 2 (enp1s0f0np0)" in p.stdout
    assert "would change on 127.0.0.63: enp1s0f1np1: add 10.60.0.13/24" in p.stdout
    assert "nothing changed (read-only)" in p.stdout
    p = cli("setup", *frig.hosts(0, 1, 2, 3), *frig.ssh, "--json", cwd=tmp_path)
    four = json.loads(p.stdout)
    assert len([x for x in four["links"] if x["node"] == "127.0.0.60"]) == 6  # three peers on each twin
    assert frig.state(0, 1, 2, 3) == before
    assert not (tmp_path / "sparkserve.yaml").exists()


def test_apply_writes_the_config_and_undo_leaves_the_nodes_as_they_were(frig, tmp_path):
    from sparkserve.config import load_config

    before = frig.state(0, 1)
    p = cli("setup", *frig.hosts(0, 1), *frig.ssh, "--fabric-range", "10.60.0.0/16", "--apply", "--yes",
            cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "wrote /etc/netplan/60-sparkserve-fabric.yaml, /etc/sparkserve/setup.json, /etc/sysctl.d/" in p.stdout
    a = frig.ports(0)
    assert a["enp1s0f1np1"][0] == 9000 and ("inet", "10.60.0.10", 24) in a["enp1s0f1np1"][2]
    assert ("inet", "10.60.1.10", 24) in a["enP2p1s0f1np1"][2]
    assert a["enp1s0f0np0"] == before[0][0]["enp1s0f0np0"]  # no cable: untouched
    netplan = frig.node_dir(1) / "etc-upper" / "netplan" / "60-sparkserve-fabric.yaml"
    assert "addresses: [10.60.0.11/24]" in netplan.read_text() and oct(netplan.stat().st_mode)[-3:] == "600"
    cfg = load_config(tmp_path / "sparkserve.yaml")
    assert [(n.host, n.port, n.fabric_ip) for n in cfg.nodes] == [("127.0.0.60", PORT, "10.60.0.10"),
                                                                  ("127.0.0.61", PORT, "10.60.0.11")]
    assert cfg.fabric.interface == "enp1s0f1np1"
    # run again: nothing left to change, the addresses are kept
    p = cli("setup", "-c", "sparkserve.yaml", "--fabric-range", "10.60.0.0/16", cwd=tmp_path)
    assert p.returncode == 0 and "would change on 127.0.0.60: enp" not in p.stdout, p.stdout
    p = cli("setup", "-c", "sparkserve.yaml", "--undo", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "removed /etc/netplan/60-sparkserve-fabric.yaml" in p.stdout
    assert frig.state(0, 1) == before


def test_addresses_set_differently_are_shown_and_refused_without_force(frig, tmp_path):
    frig.fabric(0, "ip", "addr", "add", "10.99.0.5/24", "dev", "enp1s0f1np1")
    try:
        before = frig.state(0, 1)
        args = ("setup", *frig.hosts(0, 1), *frig.ssh, "--fabric-range", "10.60.0.0/16", "--apply", "--yes")
        p = cli(*args, cwd=tmp_path)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "127.0.0.60 enp1s0f1np1: - 10.99.0.5/24  + 10.60.0.10/24" in p.stderr
        assert "refused" in p.stderr and frig.state(0, 1) == before
        p = cli(*args, "--force", "--json", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)  # one document: the discovery, what was applied, the config file
        assert doc["ok"] and doc["applied"]["127.0.0.60"]["confirmed"] and doc["config_file"].endswith(".yaml")
        assert ("inet", "10.99.0.5", 24) not in frig.ports(0)["enp1s0f1np1"][2]
        assert cli("setup", "-c", "sparkserve.yaml", "--undo", cwd=tmp_path).returncode == 0
        assert frig.state(0, 1) == before  # 10.99.0.5 is back
    finally:
        subprocess.run(["nsenter", f"--net=/proc/{frig.pid(0, 'fabric.pid')}/ns/net", "--", "ip", "addr", "del",
                        "10.99.0.5/24", "dev", "enp1s0f1np1"], capture_output=True)


def test_a_node_that_stops_answering_after_apply_rolls_itself_back(frig, tmp_path):
    from sparkserve.config import SSHConfig
    from sparkserve.nodes import hostsetup
    from sparkserve.nodes.factory import make_node
    from sparkserve.plan.fabric_setup import plan_fabric

    before = frig.state(0, 1)
    ssh = SSHConfig(config_file=frig.d / "ssh" / "config", known_hosts=frig.d / "ssh" / "known_hosts",
                    identity_file=None)
    targets = hostsetup.setup_targets(frig.hosts(0, 1))
    nodes = {n.name: make_node(n, ssh) for n in targets}
    for n in nodes.values():
        n.connect()
    found = hostsetup.discover(nodes, {n.name: n.host for n in targets})
    changes = hostsetup.node_changes(plan_fabric(list(found.values()), address_range="10.60.0.0/16"), found)

    def reconnect(name: str):
        fresh = make_node(next(t for t in targets if t.name == name), ssh)
        fresh.connect()
        return fresh

    def cut(name: str) -> None:  # node-b's sshd goes away right after its apply: nobody can reach it
        if name == "127.0.0.61":
            pid = frig.pid(1, "ssh/sshd.pid")
            os.kill(pid, signal.SIGKILL)
            while riglib.pid_alive(pid):
                time.sleep(0.02)

    try:
        done = hostsetup.apply(nodes, changes, reconnect=reconnect, rollback_s=4.0, before_confirm=cut)
        assert done["127.0.0.60"].confirmed
        assert not done["127.0.0.61"].confirmed and "stopped answering" in done["127.0.0.61"].error
        deadline = time.monotonic() + 20
        while frig.state(1) != {1: before[1]} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert frig.state(1) == {1: before[1]}, "node-b rolled itself back"
        note = frig.node_dir(1) / "tmp" / "sparkserve-setup-rollback.json"
        assert json.loads(note.read_text())["problems"] == []
    finally:
        for n in nodes.values():
            n.close()
        p = subprocess.run([sys.executable, str(RIG_PY), "up", "--nodes", "4"], env=frig.env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
    p = cli("setup", *frig.hosts(0, 1), *frig.ssh, "--undo", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert frig.state(0, 1) == before


def rig_engine_env(frig: FabricRig, state: Path) -> dict[str, str]:
    """What makes a stack run on the rig's engine emulator rather than the card's vLLM (the rig's own rig.yaml:
    image, host procfs, container limits, gates for the tiny models) as SPARKSERVE_* overrides: the config file
    stays as setup and pull wrote it."""
    import yaml

    rig = yaml.safe_load((frig.d / "rig.yaml").read_text())
    env = {"XDG_STATE_HOME": str(state)}

    def flat(prefix: str, d: dict) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                flat(f"{prefix}{k.upper()}__", v)
            else:
                env[f"{prefix}{k.upper()}"] = json.dumps(v) if isinstance(v, list | bool) else str(v)

    for section in ("host", "image", "serve", "container", "gates"):
        flat(f"SPARKSERVE_{section.upper()}__", rig[section])
    env["SPARKSERVE_MODEL__SERVED_NAME"] = rig["model"]["served_name"]
    # the stack setup configured is two of the rig's four nodes: TP 2, and the pool the emulator computes for it
    env["SPARKSERVE_SERVE__TENSOR_PARALLEL_SIZE"] = "2"
    env["SPARKSERVE_GATES__POOL_TOKENS"] = str(riglib.pool_tokens_for(
        riglib.ensure_models(), 8 << 30, rig["serve"]["kv_cache_dtype"], 2, rig["serve"]["max_model_len"]))
    assert rig["serve"]["kv_cache_memory_bytes"] == "8GiB"
    return env


@pytest.fixture(scope="module")
def weights_flow(frig, tmp_path_factory):
    """node-a and node-b from bare to a validated config: setup --apply on the hosts alone (the rig's fabric range
    and RDMA sysfs), weights pull from a local HF endpoint (token required); nothing edited by hand. Undone at
    the end of the module."""
    work = tmp_path_factory.mktemp("weights")
    models = riglib.ensure_models()
    with HFEndpoint({"tiny/target": models / "target", "tiny/drafter": models / "drafter"}, token="hf_rig40") as ep:
        p = cli("setup", *frig.hosts(0, 1), *frig.ssh, "--fabric-range", FABRIC, "--sysfs-root",
                "/srv/spark/sys-fabric", "--apply", "--yes", cwd=work)
        assert p.returncode == 0, p.stdout + p.stderr
        env = {"HF_ENDPOINT": ep.url, "HF_TOKEN": "hf_rig40"}
        p = cli("weights", "pull", "--target", "tiny/target", "--drafter", "tiny/drafter", "--python",
                sys.executable, cwd=work, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        served = ep.served_bytes
    yield work, p, served, models
    cli("setup", "-c", "sparkserve.yaml", "--undo", cwd=work)


def test_from_bare_nodes_setup_pull_ship_validate_and_up_serve_with_no_file_edited(frig, weights_flow):
    from sparkserve.config import load_config

    work, pulled, served, models = weights_flow
    total = sum(f.stat().st_size for d in ("target", "drafter") for f in (models / d).iterdir())
    assert served == total  # every byte once, through the endpoint, with the token
    assert pulled.stderr.splitlines()[-1].startswith("pull tiny/drafter: 0.01 / 0.01 GB,")
    assert pulled.stderr.splitlines()[-1].endswith("GB/s, done")
    cfg = load_config(work / "sparkserve.yaml")
    assert [n.fabric_ip for n in cfg.nodes] == [f"127.{IP_BASE + 1}.0.10", f"127.{IP_BASE + 1}.0.11"]
    assert cfg.fabric.hca == "rocep1s0f1,roceP2p1s0f1"  # read from the RDMA sysfs
    snap = "/srv/spark/home/.cache/huggingface/hub/models--tiny--target/snapshots/"
    assert str(cfg.model.target).startswith(snap) and "5ab1e0c0ffee" in str(cfg.model.target)  # pinned
    assert frig.host_path(0, str(cfg.model.target)).joinpath("model.safetensors").stat().st_size > 0
    assert not frig.host_path(1, str(cfg.model.target)).exists()

    p = cli("weights", "ship", "--json", cwd=work)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)["ship"]
    rep = out[str(Path(str(cfg.model.target)).parents[1])]["127.0.0.61"]
    repo_a = frig.host_path(0, str(Path(str(cfg.model.target)).parents[1]))
    assert rep["verified"] and rep["sent_bytes"] == sum(f.stat().st_size for f in repo_a.rglob("*")
                                                        if f.is_file() and not f.is_symlink())
    assert f"over 127.{IP_BASE + 1}.0.11" in cli("weights", "ship", cwd=work).stdout  # the fabric IP; nothing left
    env = rig_engine_env(frig, work / "state")
    p = cli("validate", cwd=work, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    try:
        p = cli("up", cwd=work, env=env, timeout=300)
        assert p.returncode == 0 and "all gates passed" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
        assert "gate identity: ok — one image and one drafter digest on 2 node(s)" in p.stderr
    finally:
        assert cli("down", cwd=work, env=env, timeout=300).returncode == 0


def test_ship_killed_halfway_resumes_and_a_corrupted_tensor_byte_is_caught(frig, weights_flow):
    from sparkserve.config import load_config
    from sparkserve.models.target_manifest import target_manifest

    work, _, _, models = weights_flow
    cfg = load_config(work / "sparkserve.yaml")
    repo = Path(str(cfg.model.target)).parents[1]
    blobs_d = frig.host_path(1, str(repo / "blobs"))
    if (w := frig.host_path(1, str(repo))).exists():
        subprocess.run(["rm", "-rf", str(w)], check=True)
    big = (models / "target" / "model.safetensors").stat().st_size
    proc = subprocess.Popen([sys.executable, "-m", "sparkserve", "weights", "ship", "--bwlimit", "40"], cwd=work,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    part = None
    while time.monotonic() < deadline and part is None:
        parts = list(blobs_d.glob("*.sparkserve-part")) if blobs_d.exists() else []
        if parts and parts[0].stat().st_size > 8 << 20:
            part = parts[0]
        time.sleep(0.05)
    assert part is not None, "the ship never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    left = part.stat().st_size
    assert 0 < left < big

    def ours() -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"sparkserve-weights" in cmd and f"127.{IP_BASE + 1}.0.11".encode() in cmd:
                    found.append(pid)
        return found

    deadline = time.monotonic() + 15
    while ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ours(), "the sender and the receiver are stopped"

    p = cli("weights", "ship", "--json", cwd=work)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)["ship"][str(repo)]["127.0.0.61"]
    assert rep["verified"]
    assert rep["sent_bytes"] <= big - left + 4096  # only the missing tail (and the small config.json) was sent

    # one tensor byte changed on node-b: the target manifest (names, sizes, headers) cannot see it; content does
    blob = next(f for f in blobs_d.iterdir() if f.stat().st_size == big)
    header = int.from_bytes(blob.read_bytes()[:8], "little")
    with open(blob, "r+b") as f:
        f.seek(8 + header + 1000)
        b = f.read(1)
        f.seek(8 + header + 1000)
        f.write(bytes([b[0] ^ 0xFF]))
    snap_a, snap_b = frig.host_path(0, str(cfg.model.target)), frig.host_path(1, str(cfg.model.target))
    assert target_manifest(str(snap_a)) == target_manifest(str(snap_b))
    p = cli("weights", "verify", cwd=work)
    assert p.returncode == 1 and f"blobs/{blob.name}" in p.stdout, p.stdout + p.stderr
    p = cli("weights", "ship", cwd=work)
    assert p.returncode == 0 and f"sent again: blobs/{blob.name}" in p.stdout, p.stdout + p.stderr
    assert cli("weights", "verify", "--rehash", cwd=work).returncode == 0


def test_an_apply_that_fails_on_the_node_leaves_nothing_half_done(frig):
    from sparkserve.config import SSHConfig
    from sparkserve.errors import RemoteFailure
    from sparkserve.nodes import hostsetup
    from sparkserve.nodes.factory import make_node

    before = frig.state(2)
    ssh = SSHConfig(config_file=frig.d / "ssh" / "config", known_hosts=frig.d / "ssh" / "known_hosts",
                    identity_file=None)
    node = make_node(hostsetup.setup_targets(frig.hosts(2))[0], ssh)
    node.connect()
    try:  # the first port takes its MTU, the second's address is refused by `ip`: the first is put back too
        args = {"ports": {"enp1s0f1np1": {"address": "10.60.9.10/24"},
                          "enP2p1s0f1np1": {"address": "10.60.9.300/24"}},
                "mtu": 9000, "netplan": "network: {version: 2}\n", "sysctl": "", "docker_user": "",
                "token": "t0", "rollback_s": 60}
        with pytest.raises(RemoteFailure, match="10.60.9.300"):
            hostsetup.run_program(node, "node_apply", args, root=True)
    finally:
        node.close()
    assert frig.state(2) == before


def test_a_stopped_pull_stops_on_the_head_and_resumes_from_what_it_fetched(frig, tmp_path):
    models = riglib.ensure_models()
    p = cli("setup", *frig.hosts(2, 3), *frig.ssh, "--fabric-range", "10.62.0.0/16", "--apply", "--yes",
            cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    hub = frig.node_dir(2) / "srv" / "home" / ".cache" / "huggingface" / "hub" / "models--slow--target"
    big = (models / "target" / "model.safetensors").stat().st_size
    try:
        with HFEndpoint({"slow/target": models / "target"}) as ep:
            ep.rate = 40e6
            env = {**os.environ, "PYTHONPATH": str(REPO), "HF_ENDPOINT": ep.url}
            argv = [sys.executable, "-m", "sparkserve", "weights", "pull", "--target", "slow/target", "--drafter",
                    "", "--no-write", "--python", sys.executable]
            proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            deadline = time.monotonic() + 60
            part = None
            while part is None and time.monotonic() < deadline:
                got = list((hub / "blobs").glob("*.sparkserve-part")) if (hub / "blobs").exists() else []
                if got and got[0].stat().st_size > 64 << 20:  # past the first progress line
                    part = got[0]
                time.sleep(0.05)
            assert part is not None, "the pull never started"
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 3, err
            assert re.search(r"pull slow/target: [\d.]+ / 0\.16 GB, 0\.0\d GB/s, ETA \d+ s", err), err
            deadline = time.monotonic() + 15
            size = -1
            while time.monotonic() < deadline and size != part.stat().st_size:  # the head's pull is stopped:
                size = part.stat().st_size                                      # its part stops growing
                time.sleep(0.5)
            assert 0 < size < big
            ep.rate = 0
            before = ep.served_bytes
            p = cli("weights", "pull", "--target", "slow/target", "--drafter", "", "--no-write", "--python",
                    sys.executable, cwd=tmp_path, env={"HF_ENDPOINT": ep.url})
            assert p.returncode == 0, p.stdout + p.stderr
            small = (models / "target" / "config.json").stat().st_size
            assert ep.served_bytes - before in (big - size, big - size + small)  # the tail, and config.json
    finally:
        assert cli("setup", "-c", "sparkserve.yaml", "--undo", cwd=tmp_path).returncode == 0
