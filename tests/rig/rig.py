#!/usr/bin/env python3
"""The rehearsal rig: N fake "DGX Spark" nodes on one Debian machine (stdlib only, run as root).

    scripts/rig up [--nodes N]     # idempotent; N defaults to the running count, else 2
    scripts/rig status             # exit 0 when every node answers over SSH and docker
    scripts/rig down [--purge [--cache]]  # stops only what `up` started (by pid); --purge also deletes node data,
                                   # --cache the rootfs tarball and model fixtures too (a fresh machine)
    scripts/rig info               # rig.json (what the pytest fixtures read)

Each node ``node-a``, ``node-b``, … is:

* a **mount namespace** held open by one ``sleep`` process (``unshare --mount --propagation private``),
  in which ``$SSRIG_DIR/nodes/<name>/srv`` is bind-mounted on ``/srv/spark``. Everything below runs
  inside that namespace, so ``/srv/spark/...`` is node-local for SSH sessions *and* for the bind mounts
  of that node's containers (a drafter can differ between nodes; a path can exist on one node only).
  The node's fake sysfs lives at ``/srv/spark/sys`` (twin ConnectX-7 HCAs, RoCEv2 GID index 3, 5, 7, …
  per node).
* one **dockerd** (own data-root, exec-root, socket, pidfile; ``--bridge none``, no iptables): its own
  image store, so shipping images is real.
* one **sshd** on ``127.0.0.(2+i):2222``, key-only root login, ``SetEnv DOCKER_HOST=<that daemon>``.

Also made once and cached: an offline Debian base image (``debootstrap --variant=minbase
--include=python3 bookworm``; the rootfs tarball is kept in ``$SSRIG_DIR/cache``), the engine-emulator
image built FROM it on node-a and loaded into every other node (same image ID everywhere), tiny real
target/drafter model directories on every node, and ``rig.yaml``: a sparkserve config for the rig.

Environment: ``SSRIG_DIR`` (default /var/lib/sparkserve-rig), ``SSRIG_NODE_ROOT`` (default /srv/spark),
``SSRIG_IP_BASE`` (2: nodes on 127.0.0.2, .3, …), ``SSRIG_SSH_PORT`` (2222), ``SSRIG_CACHE`` (``$SSRIG_DIR/cache``),
``SSRIG_PYTHON`` (python with numpy/safetensors/torch for the model fixtures; default the repo .venv),
``SSRIG_MIRROR`` (Debian mirror for debootstrap). Rig variables are ``SSRIG_*`` on purpose: sparkserve
reads ``SPARKSERVE_*`` as config overrides.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import http.client
import io
import json
import os
import py_compile
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
EMU_DIR = Path(__file__).resolve().parent / "emulator"
SERVE_ARGS_JSON = REPO / "sparkserve" / "data" / "vllm-0.33.0-serve-args.json"
TINY_MODELS = REPO / "tests" / "helpers" / "tiny_models.py"

RIG_DIR = Path(os.environ.get("SSRIG_DIR", "/var/lib/sparkserve-rig"))
NODE_ROOT = Path(os.environ.get("SSRIG_NODE_ROOT", "/srv/spark"))
SSH_PORT = int(os.environ.get("SSRIG_SSH_PORT", "2222"))
IP_BASE = int(os.environ.get("SSRIG_IP_BASE", "2"))  # node i listens on 127.0.0.(IP_BASE + i)
CACHE_DIR = Path(os.environ.get("SSRIG_CACHE", str(RIG_DIR / "cache")))
BASE_REF = "sparkserve-rig/base:bookworm"
EMU_REF = "sparkserve-emu/vllm:0.33.0-emu"
EMU_HASH_LABEL = "io.sparkserve.rig.emu-hash"
SERVED_NAME = "tiny"
DEFAULT_NODES = 2
# Model fixtures on every node (under NODE_ROOT/models): name -> tiny_models.py drafter options.
DRAFTER_VARIANTS: dict[str, dict[str, object]] = {
    "drafter": {},  # DFlash2DraftModel, block 8, mask_embedding.pt (dict form, id 154856)
    "drafter-nomask": {"mask_file": None},
    "drafter-badmask": {"mask_file_token_id": 5},
    "drafter-v1": {"architecture": "DFlashDraftModel"},
    "drafter-b16": {"block_size": 16},
}


def log(msg: str) -> None:
    print(f"rig: {msg}", file=sys.stderr, flush=True)


class RigError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------------- model


@dataclass
class NodeInfo:
    name: str
    index: int
    host: str
    port: int
    fabric_ip: str
    dir: str  # host path of the node's rig directory
    srv_dir: str  # host path that the node sees as NODE_ROOT
    docker_socket: str  # host path of the node's dockerd socket
    gid_index: int  # RoCEv2/IPv4 GID index of both HCAs in the node's fake sysfs
    hcas: list[str] = field(default_factory=lambda: ["rocep1s0f1", "roceP2p1s0f1"])
    interfaces: list[str] = field(default_factory=lambda: ["enp1s0f1np1", "enP2p1s0f1np1"])

    @property
    def docker_url(self) -> str:
        return f"unix://{self.docker_socket}"

    @property
    def tmp_dir(self) -> str:
        """Host path that the node sees as ``/tmp`` (private per node: locks, temp files)."""
        return str(Path(self.dir) / "tmp")

    def host_path(self, node_path: str | Path) -> Path:
        """Host path of a path as the node sees it (under NODE_ROOT or ``/tmp``)."""
        p = Path(node_path)
        if p == Path("/tmp") or Path("/tmp") in p.parents:
            return Path(self.tmp_dir) / p.relative_to("/tmp")
        return Path(self.srv_dir) / p.relative_to(NODE_ROOT)


def memlock_hard_limit(n: NodeInfo) -> int | None:
    """RLIMIT_MEMLOCK hard limit of the node's dockerd (None = unlimited): containers cannot exceed it
    unless the daemon holds CAP_SYS_RESOURCE."""
    pid = read_pid(Path(n.dir) / "dockerd.pid")
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max locked memory"):
                hard = line.split()[4]
                return None if hard == "unlimited" else int(hard)
    except (OSError, ValueError, IndexError):
        pass
    return None


def can_raise_memlock() -> bool:
    """Whether this machine lets root raise RLIMIT_MEMLOCK (CAP_SYS_RESOURCE in the bounding set)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapBnd:"):
                return bool(int(line.split()[1], 16) >> 24 & 1)
    except (OSError, ValueError):
        pass
    return True


def node_name(i: int) -> str:
    return f"node-{chr(ord('a') + i)}"


def make_node(i: int) -> NodeInfo:
    d = RIG_DIR / "nodes" / node_name(i)
    ip = f"127.0.0.{IP_BASE + i}"
    return NodeInfo(
        name=node_name(i), index=i, host=ip, port=SSH_PORT, fabric_ip=ip, dir=str(d), srv_dir=str(d / "srv"),
        docker_socket=str(d / "docker.sock"), gid_index=3 + 2 * i,
    )


# ------------------------------------------------------------------------------------------ utilities


def run(argv: list[str], *, check: bool = True, capture: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, text=True, capture_output=capture, **kw)
    if check and p.returncode != 0:
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-5:]
        raise RigError(f"{' '.join(argv[:4])}… exited {p.returncode}: " + " | ".join(tail))
    return p


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


#: Every long-lived process the rig starts carries ``SSRIG_OWNER=<its node dir>`` (the fabric switch: the rig
#: dir) in its environment, which survives exec (``sleep infinity``) and dockerd's children; sshd clears its
#: environment, and is known by its ``-f <node dir>/ssh/sshd_config`` argument instead (:func:`owned_by`). A pid
#: read from a pid file names the process only while that holds: with pid_max 32768 and three test processes
#: spawning ssh/docker children, a dead process's pid comes back within minutes, and a stale pid file (an sshd
#: a test killed with SIGKILL, a holder gone at a reboot) once made one rig's teardown SIGTERM another rig's
#: namespace holder at its birth ("mount namespace failed" with no output, issue 39: 2 of 4 full runs).
OWNER_VAR = "SSRIG_OWNER"


def owner_env(owner: str) -> dict[str, str]:
    return {**os.environ, OWNER_VAR: owner}


def owned_by(pid: int | None, owner: str) -> bool:
    """Whether live ``pid`` is a process the rig started for ``owner``: its environment says so, or (a process of
    an older generation, started before the variable) its arguments or its mounts name ``owner``."""
    if not pid_alive(pid):
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    mine = [e for e in env if e.startswith(f"{OWNER_VAR}=".encode())]
    if mine:
        return mine[0] == f"{OWNER_VAR}={owner}".encode()
    if any(owner in a for a in cmdline(pid or 0)):
        return True
    try:
        return f"{owner}/" in Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return False


def stop_pid(pid: int | None, what: str, timeout: float = 20.0, owner: str | None = None) -> None:
    """Stop ``pid`` (SIGTERM, then SIGKILL). ``owner``: the pid came from a pid file, so it is stopped only while
    it still is the rig's process for ``owner`` (:func:`owned_by`); a pid reused by anything else is left alone."""
    if not pid_alive(pid):
        return
    assert pid is not None
    if owner is not None and not owned_by(pid, owner):
        log(f"{what}: pid {pid} from its pid file is another process now (the pid was reused): left alone")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    log(f"{what} (pid {pid}) ignored SIGTERM for {timeout:.0f}s; SIGKILL")
    os.kill(pid, signal.SIGKILL)
    while pid_alive(pid):
        time.sleep(0.05)


def port_open(ip: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 60.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def docker_api(sock: str, method: str, path: str, body=None, headers=None, timeout: float = 60.0):
    """One Docker Engine API call over the node's unix socket → (status, body bytes)."""
    conn = _UnixHTTPConnection(sock, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def docker_ping(sock: str) -> bool:
    try:
        return docker_api(sock, "GET", "/_ping", timeout=2)[0] == 200
    except OSError:
        return False


def image_inspect(sock: str, ref: str) -> dict | None:
    st, body = docker_api(sock, "GET", f"/images/{ref}/json")
    return json.loads(body) if st == 200 else None


def docker_cli(node: NodeInfo, *args: str, **kw) -> subprocess.CompletedProcess:
    return run(["docker", "-H", node.docker_url, *args], **kw)


# ------------------------------------------------------------------------------------------- packages


def build_image(client: Any, tag: str, parent: str | None, files: dict[str, bytes]) -> str:
    """A small image on a node's docker (``client``: a docker SDK client): ``parent`` (or scratch) plus one
    ``COPY`` layer per file, built with no network; its ID. The layered images ship tests and benches use."""
    buf = io.BytesIO()
    lines = [f"FROM {parent or 'scratch'}"] + [f"COPY {name} /{name}" for name in files]
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in {"Dockerfile": "\n".join(lines).encode() + b"\n", **files}.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    buf.seek(0)
    img, _ = client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, network_mode="none")
    return str(img.id)


PACKAGES = {"dockerd": "docker.io", "/usr/sbin/sshd": "openssh-server", "debootstrap": "debootstrap",
            "rsync": "rsync", "unshare": "util-linux", "ssh-keygen": "openssh-client",
            "docker-registry": "docker-registry",  # `image ship --via registry` runs it on the head node
            "sudo": "sudo"}  # the page-cache drop before a boot runs `sudo -n` (nodes/hostfacts.py), root too


def ensure_packages() -> None:
    missing = sorted({pkg for binary, pkg in PACKAGES.items() if not shutil.which(binary)})
    if not missing:
        return
    log(f"installing Debian packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


# ---------------------------------------------------------------------------------------------- nodes


def _ssh_dir() -> Path:
    return RIG_DIR / "ssh"


def ensure_keys(nodes: list[NodeInfo]) -> None:
    sd = _ssh_dir()
    sd.mkdir(parents=True, exist_ok=True)
    os.chmod(sd, 0o700)
    key = sd / "id_ed25519"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkserve-rig-client", "-f", str(key)])
    (sd / "authorized_keys").write_text((sd / "id_ed25519.pub").read_text())
    os.chmod(sd / "authorized_keys", 0o600)
    lines = []
    for n in nodes:
        hk = Path(n.dir) / "ssh" / "ssh_host_ed25519_key"
        hk.parent.mkdir(parents=True, exist_ok=True)
        if not hk.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"rig-{n.name}", "-f", str(hk)])
        kind, b64 = (hk.with_suffix(".pub")).read_text().split()[:2]
        lines.append(f"[{n.host}]:{n.port} {kind} {b64}\n")
    (sd / "known_hosts").write_text("".join(lines))
    # an ssh client config + `ssh` wrapper for scripts that call plain `ssh -p 2222 root@127.0.0.3`
    # (the launcher): OpenSSH takes ~ from the passwd entry, so HOME cannot redirect it
    (sd / "config").write_text(
        "Host " + " ".join(n.host for n in nodes) + "\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {sd / 'known_hosts'}\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n  User root\n"
    )
    bindir = RIG_DIR / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {sd / "config"} "$@"\n')
    os.chmod(bindir / "ssh", 0o755)


def _sshd_config(n: NodeInfo) -> str:
    sd = _ssh_dir()
    nd = Path(n.dir) / "ssh"
    return "\n".join([
        f"ListenAddress {n.host}:{n.port}",
        f"HostKey {nd / 'ssh_host_ed25519_key'}",
        f"PidFile {nd / 'sshd.pid'}",
        f"AuthorizedKeysFile {sd / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "AllowTcpForwarding yes",
        "X11Forwarding no",
        "PrintMotd no",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        "LogLevel VERBOSE",
        # HOME: a node's own home (as on a real Spark), not this build machine's /root, whose .bashrc
        # runs `pyenv init` (~80 ms) on every SSH command and puts pyenv's python3 shim on PATH
        f"SetEnv DOCKER_HOST=unix://{n.docker_socket} SSRIG_NODE={n.name} HOME={NODE_ROOT / 'home'} "
        # the node's fabric ports live in a network namespace of the rig's own (see fabric_up): sparkserve's
        # fabric programs (setup, weights ship) enter it with `ip netns exec`; sshd itself stays on loopback
        f"SPARKSERVE_FABRIC_NETNS={FABRIC_NETNS}",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _holder_ok(n: NodeInfo) -> int | None:
    pid = read_pid(Path(n.dir) / "ns.pid")
    if not pid_alive(pid) or "sleep" not in " ".join(cmdline(pid)):
        return None
    assert pid is not None
    if mnt_ns(pid) == mnt_ns(os.getpid()):
        return None
    try:
        mounts = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return None
    if f" {NODE_ROOT} " not in mounts or f"{n.tmp_dir} /tmp " not in mounts:
        return None  # an older generation without the private /tmp is replaced
    if not any(line.split()[4] == "/etc" and " overlay " in line for line in mounts.splitlines()):
        return None  # nor one without its own /etc (what `sparkserve setup` writes must never reach this machine)
    return pid


def _dockerd_ok(n: NodeInfo, holder: int) -> int | None:
    pid = read_pid(Path(n.dir) / "dockerd.pid")
    if not pid_alive(pid) or n.docker_socket not in " ".join(cmdline(pid)):
        return None
    assert pid is not None
    if mnt_ns(pid) != mnt_ns(holder) or not docker_ping(n.docker_socket):
        return None
    return pid


def _sshd_ok(n: NodeInfo, holder: int) -> int | None:
    pid = read_pid(Path(n.dir) / "ssh" / "sshd.pid")
    if not pid_alive(pid) or "sshd" not in " ".join(cmdline(pid)):
        return None
    assert pid is not None
    if mnt_ns(pid) != mnt_ns(holder) or not port_open(n.host, n.port):
        return None
    try:  # an sshd started with an older config (without the fabric's SetEnv) is replaced
        if (Path(n.dir) / "ssh" / "sshd_config").read_text() != _sshd_config(n):
            return None
    except OSError:
        return None
    return pid


def _wait(pred, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise RigError(f"{what} not ready after {timeout:.0f}s")


# ---------------------------------------------------------------------------------------------- fabric
# A real second network between the nodes, in network namespaces of the rig's own (never this machine's):
# each node has one network namespace holding four ports named as a Spark's ConnectX-7 netdevs (the two
# QSFP ports, each seen as two PCIe twins: spark-field-notes §2). Each port is one end of a veth pair whose
# other end sits in the rig's "switch" namespace: the f1 twins of every node are enslaved to one bridge per
# twin (the cable, or a switch with more nodes), the f0 ports' far ends are left down (no cable: no carrier).
# Inside each node's mount namespace the node's network namespace is named FABRIC_NETNS (a tmpfs on
# /run/netns of the node's own), so `ip netns exec` on the node enters its fabric; sshd stays on loopback.

FABRIC_NETNS = "ssfabric"
# addresses for the fabric of loopback's range: 127/8 is local in this machine's namespace, so the engines (whose
# containers run there) reach a head's fabric IP, while in the nodes' namespaces the same addresses cross the
# veths (see fabric_up). `sparkserve setup --fabric-range FABRIC_RANGE --sysfs-root NODE_ROOT/sys-fabric`.
FABRIC_RANGE = f"127.{(IP_BASE + 1) % 256}.0.0/16"
FABRIC_PORTS = (("enp1s0f1np1", "br1"), ("enP2p1s0f1np1", "br2"), ("enp1s0f0np0", None), ("enP2p1s0f0np0", None))


def _switch_pid_file() -> Path:
    return RIG_DIR / "fabric-switch.pid"


def _net_holder(pid_file: Path, owner: str) -> int:
    """A process holding a new, empty network namespace (lo up); its pid, written to ``pid_file``."""
    p = subprocess.Popen(["unshare", "--net", "sh", "-c", "ip link set lo up && exec sleep infinity"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=owner_env(owner))
    pid_file.write_text(f"{p.pid}\n")
    # the shell has exec'd sleep once lo is up (its own cmdline names sleep too: look at argv[0])
    _wait(lambda: cmdline(p.pid)[:1] == ["sleep"], "fabric namespace", 10)
    return p.pid


def _in_net(pid: int, *argv: str) -> None:
    run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv])


def fabric_mac(i: int, k: int) -> str:
    return f"4c:bb:47:{IP_BASE % 256:02x}:{i:02x}:{k + 1:02x}"


def fabric_up(nodes: list[NodeInfo]) -> None:
    """The fabric (idempotent: kept while every holder lives, else made anew)."""
    sw = read_pid(_switch_pid_file())
    holders = [(read_pid(Path(n.dir) / "fabric.pid"), n.dir) for n in nodes]
    if owned_by(sw, str(RIG_DIR)) and all(owned_by(h, d) for h, d in holders):
        return
    fabric_down(nodes)
    sw = _net_holder(_switch_pid_file(), str(RIG_DIR))
    # the switch itself has no addresses: only the nodes answer on the fabric
    _in_net(sw, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.all.disable_ipv6=1")
    for br in ("br1", "br2"):
        _in_net(sw, "ip", "link", "add", br, "type", "bridge")
        _in_net(sw, "ip", "link", "set", br, "up")
    for n in nodes:
        h = _net_holder(Path(n.dir) / "fabric.pid", n.dir)
        # link-local addresses usable at once (no duplicate address detection): the ports are a fresh cable's,
        # and discovery right after `rig up` must not meet tentative addresses that neither ask nor answer
        _in_net(h, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0")
        # the fabric may use addresses of 127.0.0.0/8 (FABRIC_RANGE): then the engines, whose containers run in
        # this machine's namespace, reach the head's fabric IP over loopback, while `weights ship` crosses the
        # veths. So here loopback keeps 127.0.0.1 alone and 127/8 may travel on the ports (route_localnet).
        _in_net(h, "ip", "addr", "del", "127.0.0.1/8", "dev", "lo")
        _in_net(h, "ip", "addr", "add", "127.0.0.1/32", "dev", "lo")
        _in_net(h, "sysctl", "-qw", "net.ipv4.conf.default.route_localnet=1", "net.ipv4.conf.all.route_localnet=1")
        for k, (port, br) in enumerate(FABRIC_PORTS):
            far = f"{n.name[-1]}{k}"
            _in_net(sw, "ip", "link", "add", far, "type", "veth", "peer", "name", port, "netns", str(h))
            _in_net(h, "ip", "link", "set", port, "address", fabric_mac(n.index, k))
            _in_net(h, "ip", "link", "set", port, "up")
            if br:  # the switch takes jumbo frames, as the cable does (setup sets MTU 9000 on the nodes' ports)
                _in_net(sw, "ip", "link", "set", far, "mtu", "9000")
                _in_net(sw, "ip", "link", "set", far, "master", br)
                _in_net(sw, "ip", "link", "set", far, "up")
        holder = read_pid(Path(n.dir) / "ns.pid")
        script = ('mkdir -p /run/netns && { [ "$(findmnt -n -o FSTYPE --target /run/netns)" = tmpfs ] '
                  '|| mount -t tmpfs -o size=64k tmpfs /run/netns; } '
                  '&& { umount /run/netns/"$1" 2>/dev/null; touch /run/netns/"$1"; } '
                  '&& mount --bind /proc/"$2"/ns/net /run/netns/"$1"')
        run(["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", "sh", "-c", script, "rig-fabric", FABRIC_NETNS,
             str(h)])


def fabric_down(nodes: list[NodeInfo]) -> None:
    for n in nodes:
        stop_pid(read_pid(Path(n.dir) / "fabric.pid"), f"{n.name} fabric namespace", owner=n.dir)
        (Path(n.dir) / "fabric.pid").unlink(missing_ok=True)
    stop_pid(read_pid(_switch_pid_file()), "fabric switch", owner=str(RIG_DIR))
    _switch_pid_file().unlink(missing_ok=True)


def fabric_exec(n: NodeInfo, *argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` in node ``n``'s fabric namespace (tests compare a node's ports before and after)."""
    h = read_pid(Path(n.dir) / "fabric.pid")
    return run(["nsenter", f"--net=/proc/{h}/ns/net", "--", *argv])


def stop_node(n: NodeInfo) -> None:
    """Stop one node's sshd, containers, dockerd and namespace holder (each by its pid)."""
    d = Path(n.dir)
    stop_pid(read_pid(d / "ssh" / "sshd.pid"), f"{n.name} sshd", owner=n.dir)
    dpid = read_pid(d / "dockerd.pid")
    if owned_by(dpid, n.dir) and docker_ping(n.docker_socket):
        _remove_containers(n)
    stop_pid(dpid, f"{n.name} dockerd", timeout=30, owner=n.dir)
    # processes the daemon started (containerd, shims) that outlived it: ours, found by our paths
    for pid in _pids_referencing(n.dir):
        stop_pid(pid, f"{n.name} leftover {(cmdline(pid) or ['?'])[0]}")
    stop_pid(read_pid(d / "ns.pid"), f"{n.name} namespace holder", owner=n.dir)
    stop_pid(read_pid(d / "fabric.pid"), f"{n.name} fabric namespace", owner=n.dir)
    for f in (d / "fabric.pid", d / "ns.pid", d / "dockerd.pid", d / "ssh" / "sshd.pid"):
        f.unlink(missing_ok=True)


def _pids_referencing(path: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid() and any(path in a for a in cmdline(int(p.name))):
            out.append(int(p.name))
    return out


def _remove_containers(n: NodeInfo) -> None:
    st, body = docker_api(n.docker_socket, "GET", "/containers/json?all=1")
    if st != 200:
        return
    for c in json.loads(body):
        docker_api(n.docker_socket, "DELETE", f"/containers/{c['Id']}?force=1&v=1", timeout=60)


def _drop_stale_containerd_pid(n: NodeInfo) -> None:
    """A dockerd that died by SIGKILL takes its containerd with it (dockerd starts it with a parent-death
    signal) and leaves ``exec/containerd/containerd.pid`` behind. The next dockerd believes any live process
    with that pid is its containerd and waits for a socket that never comes ("failed to start containerd:
    timeout waiting for containerd to start"), and on a busy machine (pid_max 32768) the pid is soon reused.
    The pid file goes unless it names this node's own containerd."""
    f = Path(n.dir) / "exec" / "containerd" / "containerd.pid"
    pid = read_pid(f)
    if pid is None:
        return
    argv = cmdline(pid) if pid_alive(pid) else []
    if not (argv and Path(argv[0]).name == "containerd" and any(n.dir in a for a in argv)):
        f.unlink(missing_ok=True)


def start_node(n: NodeInfo) -> dict[str, int]:
    """Bring one node up (idempotent): namespace holder, dockerd, sshd. Returns their pids."""
    d = Path(n.dir)
    for sub in ("docker", "exec", "srv", "ssh", "tmp", "etc-upper", "etc-work"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(n.tmp_dir, 0o1777)
    holder = _holder_ok(n)
    if holder is None:
        stop_node(n)  # whatever is left of an older generation
        NODE_ROOT.mkdir(parents=True, exist_ok=True)
        # Every mount is private to the node (no propagation either way), the node root and /tmp are the
        # node's own: two rigs, or two nodes of one rig, never see each other's locks or temp files.
        # /etc is an overlay of the machine's own: what `sparkserve setup` writes on a node (/etc/netplan,
        # /etc/sysctl.d, the docker group) stays the node's, and never reaches this machine's /etc.
        script = ('mount --make-rprivate / && mount --bind "$1" "$2" && mount --bind "$3" /tmp '
                  '&& mount -t overlay overlay -o "lowerdir=/etc,upperdir=$4,workdir=$5" /etc '
                  '&& exec sleep infinity')
        # Seen twice in full runs (a 4-node rig coming up while another 4-node rig did): the holder gone with
        # an empty log. Its exit status is now in the error, and a second attempt is made once before failing.
        for attempt in (1, 2):
            with open(d / "ns.log", "w") as out:
                p = subprocess.Popen(
                    ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "rig-ns", n.srv_dir,
                     str(NODE_ROOT), n.tmp_dir, str(d / "etc-upper"), str(d / "etc-work")],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    env=owner_env(n.dir),
                )
            (d / "ns.pid").write_text(f"{p.pid}\n")
            _wait(lambda p=p: _holder_ok(n) is not None or p.poll() is not None, f"{n.name} namespace", 10)
            holder = _holder_ok(n)
            if holder is not None:
                break
            why = f"exit {p.poll()}: {(d / 'ns.log').read_text().strip() or '(no output)'}"
            if attempt == 2:
                raise RigError(f"{n.name}: mount namespace failed twice: {why}")
            log(f"{n.name}: mount namespace failed ({why}): once more")
            stop_pid(p.pid if p.poll() is None else None, f"{n.name} namespace holder")
    nsenter = ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--"]
    dockerd = _dockerd_ok(n, holder)
    if dockerd is None:
        stop_pid(read_pid(d / "dockerd.pid"), f"{n.name} stale dockerd", owner=n.dir)
        (d / "dockerd.pid").unlink(missing_ok=True)
        Path(n.docker_socket).unlink(missing_ok=True)
        _drop_stale_containerd_pid(n)
        with open(d / "dockerd.log", "a") as out:
            subprocess.Popen(
                [*nsenter, "dockerd", "--data-root", str(d / "docker"), "--exec-root", str(d / "exec"),
                 "--pidfile", str(d / "dockerd.pid"), "-H", n.docker_url, "--bridge", "none",
                 "--iptables=false", "--ip-masq=false", "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env=owner_env(n.dir),
            )
        _wait(lambda: _dockerd_ok(n, holder) is not None, f"{n.name} dockerd", 60)
        dockerd = _dockerd_ok(n, holder)
        assert dockerd is not None
    sshd = _sshd_ok(n, holder)
    if sshd is None:
        stop_pid(read_pid(d / "ssh" / "sshd.pid"), f"{n.name} stale sshd", owner=n.dir)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        cfg = d / "ssh" / "sshd_config"
        cfg.write_text(_sshd_config(n))
        run([*nsenter, "/usr/sbin/sshd", "-t", "-f", str(cfg)])
        run([*nsenter, "/usr/sbin/sshd", "-f", str(cfg), "-E", str(d / "ssh" / "sshd.log")], env=owner_env(n.dir))
        _wait(lambda: _sshd_ok(n, holder) is not None, f"{n.name} sshd", 15)
        sshd = _sshd_ok(n, holder)
        assert sshd is not None
    return {"holder": holder, "dockerd": dockerd, "sshd": sshd}


# --------------------------------------------------------------------------------------------- images


def base_tarball() -> Path:
    cache = CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    tar = cache / "basefs-bookworm.tar"
    if tar.exists():
        return tar
    tmp = cache / "basefs.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    log("debootstrap --variant=minbase --include=python3 bookworm (once; cached)")
    argv = ["debootstrap", "--variant=minbase", "--include=python3", "bookworm", str(tmp)]
    if os.environ.get("SSRIG_MIRROR"):
        argv.append(os.environ["SSRIG_MIRROR"])
    run(argv)
    # apt caches and logs are not needed in the image
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
        for f in (tmp / sub).glob("*"):
            if f.is_file():
                f.unlink()
    run(["tar", "-C", str(tmp), "--numeric-owner", "-cf", str(tar) + ".part", "."])
    os.replace(str(tar) + ".part", tar)
    shutil.rmtree(tmp, ignore_errors=True)
    return tar


def emulator_bytecode() -> bytes:
    """The emulator byte-compiled by this Python (unchecked-hash .pyc: valid whatever the file's mtime in the
    image). The image's python3 is Debian 12's 3.11, as is the rig's; under another version the tag in the
    file name differs and the emulator is compiled at each start instead, as before."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "e.pyc"
        py_compile.compile(str(EMU_DIR / "vllm_emulator.py"), cfile=str(out), doraise=True,
                           dfile="/opt/sparkserve-emu/vllm_emulator.py",
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        return out.read_bytes()


def emulator_context() -> tuple[bytes, str]:
    """The emulator image build context (a tar) and its content hash."""
    files = {
        "Dockerfile": (EMU_DIR / "Dockerfile").read_bytes(),
        "vllm_emulator.py": (EMU_DIR / "vllm_emulator.py").read_bytes(),
        f"__pycache__/vllm_emulator.{sys.implementation.cache_tag}.pyc": emulator_bytecode(),
        "serve-args.json": SERVE_ARGS_JSON.read_bytes(),
        "bin/vllm": (EMU_DIR / "bin" / "vllm").read_bytes(),
        "bin/ray": (EMU_DIR / "bin" / "ray").read_bytes(),
    }
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o755 if name.startswith("bin/") else 0o644
            ti.mtime = 0
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue(), h.hexdigest()[:16]


def ensure_images(nodes: list[NodeInfo]) -> str:
    """Base image + emulator image on node-a, shipped to the others; returns the emulator image ID."""
    a = nodes[0]
    ctx, emu_hash = emulator_context()
    emu = image_inspect(a.docker_socket, EMU_REF)
    if emu is None or (emu.get("Config") or {}).get("Labels", {}).get(EMU_HASH_LABEL) != emu_hash:
        if image_inspect(a.docker_socket, BASE_REF) is None:
            tar = base_tarball()
            log(f"importing {BASE_REF} into {a.name}")
            docker_cli(a, "import", "-c", 'CMD ["/bin/bash"]', "-c",
                       "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", str(tar), BASE_REF)
        log(f"building {EMU_REF} on {a.name}")
        labels = quote(json.dumps({EMU_HASH_LABEL: emu_hash}))
        q = f"/build?t={quote(EMU_REF)}&rm=1&forcerm=1&networkmode=none&labels={labels}"
        st, body = docker_api(a.docker_socket, "POST", q, body=ctx,
                              headers={"Content-Type": "application/x-tar"}, timeout=300)
        errors = [json.loads(x).get("error") for x in body.decode().splitlines() if x.strip().startswith("{")]
        errors = [e for e in errors if e]
        if st != 200 or errors:
            raise RigError(f"emulator image build failed ({st}): {errors or body[-500:]!r}")
        emu = image_inspect(a.docker_socket, EMU_REF)
        assert emu is not None
    emu_id = emu["Id"]
    for n in nodes[1:]:
        have = image_inspect(n.docker_socket, EMU_REF)
        if have and have["Id"] == emu_id:
            continue
        log(f"shipping {EMU_REF} {emu_id[7:19]} to {n.name} (docker save | docker load)")
        save = subprocess.Popen(["docker", "-H", a.docker_url, "save", EMU_REF, BASE_REF], stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "-H", n.docker_url, "load", "-q"], stdin=save.stdout,
                              capture_output=True, text=True)
        assert save.stdout is not None
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise RigError(f"shipping the emulator image to {n.name} failed: {load.stderr.strip()}")
        got = image_inspect(n.docker_socket, EMU_REF)
        if not got or got["Id"] != emu_id:
            raise RigError(f"{n.name} has {EMU_REF} with another image ID after load")
    for n in nodes:  # earlier emulator builds, untagged now
        docker_api(n.docker_socket, "POST", "/images/prune?filters=" + quote('{"dangling":["true"]}'))
    return emu_id


# ------------------------------------------------------------------------------- node filesystem views


def _python_for_models() -> str:
    py = os.environ.get("SSRIG_PYTHON") or str(REPO / ".venv" / "bin" / "python")
    if not Path(py).exists():
        raise RigError(f"{py} not found: the model fixtures need a python with numpy, safetensors and torch "
                       "(scripts/test builds .venv; or set SSRIG_PYTHON)")
    return py


def ensure_models() -> Path:
    """Tiny real target/drafter directories, generated once per tiny_models.py version."""
    src = TINY_MODELS.read_bytes() + json.dumps(DRAFTER_VARIANTS, sort_keys=True).encode()
    key = hashlib.sha256(src).hexdigest()[:12]
    out = CACHE_DIR / f"models-{key}"
    if (out / ".complete").exists():
        return out
    import fcntl

    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".models-{key}.lock", "a+") as lock:  # two test processes (scripts/test --quick's
        fcntl.flock(lock, fcntl.LOCK_EX)                          # workers) on a fresh machine: one generates
        if (out / ".complete").exists():
            return out
        return _generate_models(out)


def _generate_models(out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    log("generating tiny target/drafter fixtures")
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(TINY_MODELS.parent)!r})\n"
        "from pathlib import Path\n"
        "import tiny_models as tm\n"
        "out = Path(sys.argv[1]); variants = json.loads(sys.argv[2])\n"
        "tm.write_target(out / 'target')\n"
        "for name, opts in variants.items():\n"
        "    tm.write_drafter(out / name, tm.DrafterSpec(**opts))\n"
    )
    run([_python_for_models(), "-c", code, str(out), json.dumps(DRAFTER_VARIANTS)])
    (out / ".complete").write_text("ok\n")
    return out


def sync_models(n: NodeInfo, models: Path) -> None:
    dst = Path(n.srv_dir) / "models"
    dst.mkdir(parents=True, exist_ok=True)
    names = ["target", *DRAFTER_VARIANTS]
    for name in names:
        run(["rsync", "-a", "--delete", "--checksum", f"{models / name}/", f"{dst / name}/"])
    for sub in ("vllm", "flashinfer", "triton"):
        (Path(n.srv_dir) / "cache" / sub).mkdir(parents=True, exist_ok=True)
    (Path(n.srv_dir) / "home").mkdir(mode=0o700, exist_ok=True)


PROCESS_VLLM = NODE_ROOT / "bin" / "vllm"  # runtime: process — the emulator as a host process (serve.vllm)


def install_process_engine(n: NodeInfo) -> Path:
    """The emulator as a host program on the node, for ``runtime: process``: ``/srv/spark/emu/`` (the emulator
    and vLLM 0.33.0's option list) and ``/srv/spark/bin/vllm``, a launcher that runs it with the node's
    ``python3`` exactly as the image's ``/usr/local/bin/vllm`` does (same environment as the image's ENV).
    Idempotent; returns the launcher's node path."""
    emu = Path(n.srv_dir) / "emu"
    emu.mkdir(parents=True, exist_ok=True)
    for src, name in ((EMU_DIR / "vllm_emulator.py", "vllm_emulator.py"), (SERVE_ARGS_JSON, "serve-args.json")):
        data = src.read_bytes()
        if not (emu / name).exists() or (emu / name).read_bytes() != data:
            (emu / f".{name}.tmp").write_bytes(data)
            os.replace(emu / f".{name}.tmp", emu / name)
    node_emu = NODE_ROOT / "emu"
    launcher = (
        "#!/bin/sh\n# sparkserve engine emulator (not vLLM) as a host process: runtime: process on the rig\n"
        f"export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 SSEMU_SERVE_ARGS={node_emu / 'serve-args.json'}\n"
        f'exec python3 {node_emu / "vllm_emulator.py"} "$@"\n'
    )
    host = n.host_path(PROCESS_VLLM)
    host.parent.mkdir(parents=True, exist_ok=True)
    if not host.exists() or host.read_text() != launcher:
        tmp = host.with_name(".vllm.tmp")
        tmp.write_text(launcher)
        os.chmod(tmp, 0o755)
        os.replace(tmp, host)
    return PROCESS_VLLM


def _mac(i: int, port: int) -> str:
    return f"4c:bb:47:a{i % 10}:{port:02x}:0{i % 10}"


def _gid_from_mac(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    eui = [b[0] ^ 0x02, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    words = ["fe80", "0000", "0000", "0000"] + [f"{eui[k]:02x}{eui[k + 1]:02x}" for k in range(0, 8, 2)]
    return ":".join(words)


def _gid_v4(ip: str) -> str:
    o = [int(x) for x in ip.split(".")]
    return f"0000:0000:0000:0000:0000:ffff:{o[0]:02x}{o[1]:02x}:{o[2]:02x}{o[3]:02x}"


def fabric_ips(n: NodeInfo) -> tuple[str, str]:
    """The addresses `sparkserve setup --fabric-range FABRIC_RANGE` gives node ``n``'s two twins when it is run
    on the rig's nodes in order (one /24 per twin, host 10 + the node's place)."""
    net = FABRIC_RANGE.split(".")
    return f"{net[0]}.{net[1]}.0.{10 + n.index}", f"{net[0]}.{net[1]}.1.{10 + n.index}"


def write_fake_sysfs(n: NodeInfo, sub: str = "sys", ips: tuple[str, str] | None = None) -> None:
    """A node's /sys/class/{net,infiniband} subset as on a DGX Spark, under NODE_ROOT/sys.

    Both CX-7 twins are ACTIVE with MTU 9000; the IPv4 RoCEv2 GID sits at index ``n.gid_index``
    (3 on node-a, 5 on node-b, …) because each node carries ``n.index`` extra IPv6 GID pairs first.
    Unused GID entries read as all zeros and have no ``types`` file (the kernel answers EINVAL there).
    ``sub``/``ips``: the same tree under NODE_ROOT/``sub`` with the twins' IPv4 GIDs for ``ips`` (sys-fabric:
    the GID table a CX-7 shows once `setup` gave its ports the fabric's addresses, :func:`fabric_ips`).
    """
    root = Path(n.srv_dir) / sub
    shutil.rmtree(root, ignore_errors=True)
    twins = [("enp1s0f1np1", "rocep1s0f1", ips[0] if ips else n.fabric_ip),
             ("enP2p1s0f1np1", "roceP2p1s0f1", ips[1] if ips else f"127.1.0.{IP_BASE + n.index}")]

    def w(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    for k, (ifname, hca, ip) in enumerate(twins):
        mac = _mac(n.index, k + 1)
        nd = root / "class" / "net" / ifname
        for f, v in {"operstate": "up", "carrier": "1", "mtu": "9000", "address": mac, "type": "1",
                     "ifindex": str(10 + k), "speed": "100000"}.items():
            w(nd / f, v)
        (nd / "device" / "infiniband" / hca).mkdir(parents=True, exist_ok=True)
        port = root / "class" / "infiniband" / hca / "ports" / "1"
        for f, v in {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "Ethernet",
                     "rate": "100 Gb/sec (2X NDR)"}.items():
            w(port / f, v)
        (root / "class" / "infiniband" / hca / "device" / "net" / ifname).mkdir(parents=True, exist_ok=True)
        ll = _gid_from_mac(mac)
        entries = [(ll, "IB/RoCE v1"), (ll, "RoCE v2")]
        for j in range(n.index):
            v6 = f"fd00:0000:0000:{j + 1:04x}:0000:0000:0000:{n.index + IP_BASE:04x}"
            entries += [(v6, "IB/RoCE v1"), (v6, "RoCE v2")]
        entries += [(_gid_v4(ip), "IB/RoCE v1"), (_gid_v4(ip), "RoCE v2")]
        assert entries.index((_gid_v4(ip), "RoCE v2")) == n.gid_index
        for idx in range(16):
            if idx < len(entries):
                gid, typ = entries[idx]
                w(port / "gids" / str(idx), gid)
                w(port / "gid_attrs" / "types" / str(idx), typ)
                w(port / "gid_attrs" / "ndevs" / str(idx), ifname)
            else:
                w(port / "gids" / str(idx), "0000:0000:0000:0000:0000:0000:0000:0000")
    mg = root / "class" / "net" / "enP7s7"
    for f, v in {"operstate": "up", "carrier": "1", "mtu": "1500", "address": _mac(n.index, 7), "type": "1"}.items():
        w(mg / f, v)
    for _, hca, _ in twins:  # the CX-7 firmware version (doctor compares it across nodes)
        w(root / "class" / "infiniband" / hca / "fw_ver", FAKE_FW)


# What a healthy DGX Spark's procfs says (nodes/hostfacts.py reads these under host.proc_root): 128 GB unified
# memory (MemTotal as DGX OS reports it), most of it free, plenty of 2 MiB+ blocks; a fixed uptime so that a
# kmsg record's microseconds place it before or after "now" (usec > FAKE_UPTIME_S * 1e6: after the boot began).
FAKE_UPTIME_S = 100000.0
FAKE_FW = "28.45.1200"
FAKE_KERNEL = "6.11.0-1016-nvidia"
GiB_KB = 1024 * 1024


def fake_meminfo(total_gib: float = 119.7, free_gib: float = 110.0, available_gib: float = 115.0) -> str:
    kb = {"MemTotal": total_gib, "MemFree": free_gib, "MemAvailable": available_gib,
          "Buffers": 0.1, "Cached": max(0.0, available_gib - free_gib)}
    return "".join(f"{k + ':':<16}{int(v * GiB_KB):>9} kB\n" for k, v in kb.items())


def fake_buddyinfo(order10_blocks: int = 20000) -> str:
    """Zones with ``order10_blocks`` free 4 MiB blocks (order 10, 4 KiB pages) and a few small ones."""
    return (f"Node 0, zone      DMA      3      2      1      0      1      1      1      0      1      1      2\n"
            f"Node 0, zone   Normal    512    300    120     60     30     15      8      4      2      1 "
            f"{order10_blocks:>6}\n")


def kmsg_record(seq: int, seconds: float, text: str, level: int = 6) -> str:
    """One /dev/kmsg record (``pri,seq,usec,flags;message``) ``seconds`` after the fake host's boot."""
    return f"{level},{seq},{int(seconds * 1e6)},-;{text}\n"


def write_fake_proc(n: NodeInfo) -> Path:
    """A node's procfs subset as on a DGX Spark, under NODE_ROOT/proc (host.proc_root in rig.yaml): meminfo,
    buddyinfo, uptime, cmdline, sys/kernel/osrelease, sys/vm/{swappiness,drop_caches,compact_memory}, the NVIDIA
    driver version, and ``kmsg`` (host.kernel_log: /dev/kmsg's record format) with boot-time lines only.
    Rewritten on every `up`: a test that changes a file puts it back with this."""
    root = Path(n.srv_dir) / "proc"
    shutil.rmtree(root, ignore_errors=True)
    files = {
        "meminfo": fake_meminfo(),
        "buddyinfo": fake_buddyinfo(),
        "uptime": f"{FAKE_UPTIME_S:.2f} {FAKE_UPTIME_S * 10:.2f}\n",
        "cmdline": f"BOOT_IMAGE=/boot/vmlinuz-{FAKE_KERNEL} root=/dev/nvme0n1p2 ro iommu.passthrough=1\n",
        "sys/kernel/osrelease": FAKE_KERNEL + "\n",
        "sys/vm/swappiness": "1\n",
        "sys/vm/drop_caches": "",
        "sys/vm/compact_memory": "",
        "driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
                                 "(dvs-builder@U22-I3-AM02-24-3)  Wed Sep 17 19:40:09 UTC 2025\n",
        "kmsg": kmsg_record(1, 0.0, f"Linux version {FAKE_KERNEL}") + kmsg_record(
            2, 12.5, "NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  580.95.05"),
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


# ----------------------------------------------------------------------------------------- rig config


def pool_tokens_for(models: Path, kv_bytes: int, kv_dtype: str, tp: int, max_model_len: int) -> int:
    sys.path.insert(0, str(EMU_DIR))
    import vllm_emulator as emu  # noqa: E402  (stdlib-only module next to this file)

    target = json.loads((models / "target" / "config.json").read_text())
    drafter = json.loads((models / "drafter" / "config.json").read_text())
    return emu.kv_cache_plan(target, drafter, kv_bytes=kv_bytes, kv_cache_dtype=kv_dtype, tp=tp,
                             max_model_len=max_model_len).tokens


def write_rig_yaml(nodes: list[NodeInfo], models: Path) -> Path:
    kv_bytes, kv_dtype, mml = 8 * 2**30, "fp8_e4m3", 262144
    pool = pool_tokens_for(models, kv_bytes, kv_dtype, len(nodes), mml)
    lines = [
        "# sparkserve config for the local rehearsal rig (written by scripts/rig up; do not edit).",
        "# The engine is the sparkserve engine emulator, not vLLM; GPUs and RDMA devices are off.",
        "nodes:",
    ]
    for n in nodes:
        lines.append(f"  - {{name: {n.name}, host: {n.host}, port: {n.port}, fabric_ip: {n.fabric_ip}, user: root}}")
    lines += [
        "ssh:",
        f"  known_hosts: {_ssh_dir() / 'known_hosts'}",
        f"  identity_file: {_ssh_dir() / 'id_ed25519'}",
        "fabric:",
        f"  sysfs_root: {NODE_ROOT / 'sys'}",
        "  master_port: 29501",
        "host:                      # each node's fake procfs and kernel log (write_fake_proc)",
        f"  proc_root: {NODE_ROOT / 'proc'}",
        f"  kernel_log: {NODE_ROOT / 'proc' / 'kmsg'}",
        "image:",
        f"  ref: {EMU_REF}",
        "model:",
        f"  target: {NODE_ROOT / 'models' / 'target'}",
        f"  served_name: {SERVED_NAME}",
        "drafter:",
        f"  path: {NODE_ROOT / 'models' / 'drafter'}",
        "serve:",
        f"  tensor_parallel_size: {len(nodes)}",
        f"  host: {nodes[0].host}             # head API on loopback",
        "  port: 8000",
        f"  max_model_len: {mml}",
        f"  kv_cache_dtype: {kv_dtype}",
        "  kv_cache_memory_bytes: 8GiB",
        "  ready_timeout_s: 120",
        "container:",
        "  gpus: none",
        "  rdma_devices: []",
        f"  cache_root: {NODE_ROOT / 'cache'}",
        "  stop_timeout_s: 5",
        *([f"  memlock: {cap}             # this daemon cannot grant unlimited (no CAP_SYS_RESOURCE)"]
          if (cap := memlock_hard_limit(nodes[0])) is not None and not can_raise_memlock() else []),
        "gates:",
        f"  pool_tokens: {pool}        # what the emulator computes for this config",
        "  mask_token_id: 154856",
        "",
    ]
    path = RIG_DIR / "rig.yaml"
    path.write_text("\n".join(lines))
    return path


# ----------------------------------------------------------------------------------------------- state


def state_path() -> Path:
    return RIG_DIR / "rig.json"


_LOCK_STATE = {"depth": 0, "file": None}


@contextlib.contextmanager
def exclusive_use():
    """Exclusive use of the rig by one test process at a time: an flock on ``$SSRIG_DIR/.test-lock``.

    Re-entrant within a process (a module-wide hold and a per-test hold nest); other processes — another
    helper's pytest, ``flock $SSRIG_DIR/.test-lock CMD`` — wait until it is released."""
    import fcntl

    if _LOCK_STATE["depth"] == 0:
        RIG_DIR.mkdir(parents=True, exist_ok=True)
        f = open(RIG_DIR / ".test-lock", "a+")  # noqa: SIM115 (held across the yield)
        fcntl.flock(f, fcntl.LOCK_EX)
        _LOCK_STATE["file"] = f
    _LOCK_STATE["depth"] += 1
    try:
        yield
    finally:
        _LOCK_STATE["depth"] -= 1
        if _LOCK_STATE["depth"] == 0:
            f = _LOCK_STATE["file"]
            _LOCK_STATE["file"] = None
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()


def load_info() -> dict:
    """rig.json as written by `up` (raises RigError when the rig was never brought up)."""
    try:
        return json.loads(state_path().read_text())
    except OSError:
        raise RigError(f"{state_path()} missing: run scripts/rig up") from None


def nodes_from_info(info: dict) -> list[NodeInfo]:
    return [NodeInfo(**n) for n in info["nodes"]]


def _current_count() -> int | None:
    try:
        return len(load_info()["nodes"])
    except (RigError, KeyError, ValueError):
        return None


@dataclass
class RigHandle:
    """What the pytest fixtures hand out: the rig as data (see tests/conftest.py)."""

    dir: Path
    node_root: Path
    nodes: list[NodeInfo]
    user: str
    identity_file: Path
    known_hosts: Path
    ssh_config: Path
    ssh_wrapper_dir: Path
    rig_yaml: Path
    image_ref: str
    image_id: str
    models: dict[str, str]  # fixture name -> node-local path (same on every node)
    served_name: str
    info: dict

    @classmethod
    def from_info(cls, info: dict) -> RigHandle:
        return cls(
            dir=Path(info["rig_dir"]), node_root=Path(info["node_root"]), nodes=nodes_from_info(info),
            user=info["ssh"]["user"], identity_file=Path(info["ssh"]["identity_file"]),
            known_hosts=Path(info["ssh"]["known_hosts"]), ssh_config=Path(info["ssh"]["config"]),
            ssh_wrapper_dir=Path(info["ssh"]["wrapper_dir"]), rig_yaml=Path(info["rig_yaml"]),
            image_ref=info["image"]["ref"], image_id=info["image"]["id"], models=dict(info["models"]),
            served_name=info["served_name"], info=info,
        )

    def node(self, name: str) -> NodeInfo:
        return next(n for n in self.nodes if n.name == name)

    @property
    def head(self) -> NodeInfo:
        return self.nodes[0]

    def ssh_argv(self, node: NodeInfo, *remote: str) -> list[str]:
        """argv of an OpenSSH call to ``node`` with the rig's key and known_hosts (remote argv quoted)."""
        import shlex

        return ["/usr/bin/ssh", "-F", str(self.ssh_config), "-p", str(node.port), f"{self.user}@{node.host}",
                " ".join(shlex.quote(a) for a in remote)]

    def reset_models(self) -> None:
        """Put the pristine model fixtures back on every node (tests that alter a drafter call this)."""
        models = ensure_models()
        for n in self.nodes:
            sync_models(n, models)


# ----------------------------------------------------------------------------------------------- verbs


def up(nnodes: int | None = None, *, bare: bool = False) -> dict:
    """Bring the rig up (idempotent); concurrent callers are serialised by an flock on ``$SSRIG_DIR/.up-lock``.

    ``bare``: the nodes' daemons, keys and sysfs only — no images, models or rig.yaml (a second rig that a
    test brings up beside the shared one to prove the two cannot interfere)."""
    if os.geteuid() != 0:
        raise RigError("the rig needs root (it starts dockerd and sshd)")
    import fcntl

    RIG_DIR.mkdir(parents=True, exist_ok=True)
    with open(RIG_DIR / ".up-lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _up(nnodes, bare)


def _up(nnodes: int | None, bare: bool = False) -> dict:
    t0 = time.monotonic()
    ensure_packages()
    RIG_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(RIG_DIR, 0o700)
    if RIG_DIR.resolve() == Path("/tmp") or Path("/tmp") in RIG_DIR.resolve().parents:
        raise RigError(f"SSRIG_DIR {RIG_DIR} is under /tmp: each node mounts a private /tmp over it, which would "
                       "hide the node's own daemons' files (use /var/tmp or /var/lib)")
    longest = RIG_DIR / "nodes" / "node-a" / "exec" / "containerd" / "containerd.sock.ttrpc"
    if len(str(longest)) > 100:
        raise RigError(f"SSRIG_DIR {RIG_DIR} is too long: the daemons' unix sockets under it exceed 108 bytes")
    count = nnodes or _current_count() or DEFAULT_NODES
    if count < 1 or count > 20:
        raise RigError(f"--nodes {count}: between 1 and 20")
    # shrink: stop nodes beyond the requested count
    for d in sorted((RIG_DIR / "nodes").glob("node-*")) if (RIG_DIR / "nodes").exists() else []:
        i = ord(d.name[-1]) - ord("a")
        if i >= count:
            log(f"stopping {d.name} (not in --nodes {count})")
            stop_node(make_node(i))
    nodes = [make_node(i) for i in range(count)]
    ensure_keys(nodes)
    with concurrent.futures.ThreadPoolExecutor(max_workers=count) as ex:
        pids = dict(zip([n.name for n in nodes], ex.map(start_node, nodes), strict=True))
    fabric_up(nodes)
    t_nodes = time.monotonic() - t0
    if bare:
        for n in nodes:
            write_fake_sysfs(n)
            write_fake_sysfs(n, "sys-fabric", fabric_ips(n))
            write_fake_proc(n)
        info = {"rig_dir": str(RIG_DIR), "node_root": str(NODE_ROOT), "nodes": [asdict(n) for n in nodes],
                "pids": pids, "bare": True}
        state_path().write_text(json.dumps(info, indent=2) + "\n")
        log(f"up (bare): {count} nodes in {time.monotonic() - t0:.1f}s")
        return info
    emu_id = ensure_images(nodes)
    models = ensure_models()
    for n in nodes:
        sync_models(n, models)
        write_fake_sysfs(n)
        write_fake_sysfs(n, "sys-fabric", fabric_ips(n))
        write_fake_proc(n)
        install_process_engine(n)
    rig_yaml = write_rig_yaml(nodes, models)
    info = {
        "rig_dir": str(RIG_DIR),
        "node_root": str(NODE_ROOT),
        "nodes": [asdict(n) for n in nodes],
        "pids": pids,
        "ssh": {"user": "root", "identity_file": str(_ssh_dir() / "id_ed25519"),
                "known_hosts": str(_ssh_dir() / "known_hosts"), "config": str(_ssh_dir() / "config"),
                "wrapper_dir": str(RIG_DIR / "bin")},
        "image": {"ref": EMU_REF, "id": emu_id, "base_ref": BASE_REF},
        "models": {name: str(NODE_ROOT / "models" / name) for name in ["target", *DRAFTER_VARIANTS]},
        "served_name": SERVED_NAME,
        "rig_yaml": str(rig_yaml),
    }
    state_path().write_text(json.dumps(info, indent=2) + "\n")
    log(f"up: {count} nodes in {time.monotonic() - t0:.1f}s (daemons {t_nodes:.1f}s); config {rig_yaml}")
    return info


def down(purge: bool = False, cache: bool = False) -> None:
    """Stop every node; ``purge``: delete the rig's data too; ``cache``: and its cache (a fresh machine's start:
    CI begins there, .ci/run)."""
    nodes_dir = RIG_DIR / "nodes"
    dirs = sorted(nodes_dir.glob("node-*")) if nodes_dir.exists() else []
    for d in dirs:
        n = make_node(ord(d.name[-1]) - ord("a"))
        stop_node(n)
        log(f"{n.name} stopped")
    stop_pid(read_pid(_switch_pid_file()), "fabric switch", owner=str(RIG_DIR))
    _switch_pid_file().unlink(missing_ok=True)
    leftovers = _pids_referencing(str(RIG_DIR / "nodes"))  # daemons, shims, holders: all run below nodes/
    mounts = [line for line in Path("/proc/self/mounts").read_text().splitlines() if str(RIG_DIR) in line]
    if leftovers or mounts:
        raise RigError(f"left behind: pids {leftovers} mounts {mounts}")
    if purge:
        for sub in ("nodes", "ssh", "bin", "build"):
            shutil.rmtree(RIG_DIR / sub, ignore_errors=True)
        for f in (state_path(), RIG_DIR / "rig.yaml"):
            f.unlink(missing_ok=True)
        if cache:
            shutil.rmtree(CACHE_DIR, ignore_errors=True)
            log(f"rig data and its cache {CACHE_DIR} removed: the next `up` starts as on a fresh machine")
        else:
            log(f"rig data removed (the cache {CACHE_DIR} stays: base rootfs tarball, model fixtures)")
    # NODE_ROOT stays, even when empty: it is the mount point of every node of every rig on this machine, and
    # removing a directory that is a mount point in another mount namespace silently unmounts it there.


def status() -> bool:
    try:
        info = load_info()
    except RigError as e:
        log(str(e))
        return False
    ok = True
    for n in nodes_from_info(info):
        holder = _holder_ok(n)
        dockerd = _dockerd_ok(n, holder) if holder else None
        sshd = _sshd_ok(n, holder) if holder else None
        img = image_inspect(n.docker_socket, EMU_REF) if dockerd else None
        same = bool(img) and img["Id"] == info["image"]["id"]
        good = bool(holder and dockerd and sshd and same)
        ok &= good
        print(f"{n.name} {n.host}:{n.port} ns={holder} dockerd={dockerd} sshd={sshd} "
              f"emulator-image={'ok' if same else 'MISSING'} {'up' if good else 'DOWN'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/rig", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    u = sub.add_parser("up", help="start (or reuse) the rig")
    u.add_argument("--nodes", type=int, default=None)
    u.add_argument("--bare", action="store_true", help="daemons only: no images, models or rig.yaml")
    d = sub.add_parser("down", help="stop everything the rig started")
    d.add_argument("--purge", action="store_true", help="also delete node data (images, models)")
    d.add_argument("--cache", action="store_true", help="with --purge: the cache too (base rootfs, model fixtures)")
    sub.add_parser("status", help="is every node up?")
    sub.add_parser("info", help="print rig.json")
    a = ap.parse_args(argv)
    try:
        if a.verb == "up":
            up(a.nodes, bare=a.bare)
        elif a.verb == "down":
            if a.cache and not a.purge:
                print("error: --cache: only with --purge", file=sys.stderr)
                return 2
            down(a.purge, a.cache)
        elif a.verb == "status":
            return 0 if status() else 1
        elif a.verb == "info":
            print(json.dumps(load_info(), indent=2))
    except RigError as e:
        print(f"error: rig: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
