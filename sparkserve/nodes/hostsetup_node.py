"""The programs `sparkserve setup` runs ON a node (standard library only; shipped by source as ``python3 -c``
with one JSON argv item, never through a shell): :func:`node_discover` (read-only), :func:`node_apply`,
:func:`node_confirm` and :func:`node_undo`.

Every file they write is sparkserve's own and listed in the state file ``/etc/sparkserve/setup.json``
(:data:`STATE`), together with what each port held before (addresses, MTU) and whether the user was added to
the ``docker`` group, so that :func:`node_undo` puts the node back as it was.

``node_apply`` is applied with a rollback, as ``netplan try`` does: before it touches a port it starts a
detached watchdog that undoes this apply at a deadline unless :func:`node_confirm` — run by the control
machine over a *new* SSH connection once the apply returned — removed the pending file first. A node that
stopped answering is therefore back as it was at the deadline, without anyone reaching it.
"""

from __future__ import annotations

STATE_DIR = "/etc/sparkserve"
STATE = "/etc/sparkserve/setup.json"
PENDING = "/etc/sparkserve/setup.pending"
ROLLBACK_NOTE = "/tmp/sparkserve-setup-rollback.json"  # what the watchdog did (read once the node answers again)
NETPLAN_FILE = "/etc/netplan/60-sparkserve-fabric.yaml"
SYSCTL_FILE = "/etc/sysctl.d/60-sparkserve.conf"


def _ip_json(*args: str) -> list:  # type: ignore[type-arg]
    import json
    import subprocess

    p = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=20)
    return json.loads(p.stdout or "[]") if p.returncode == 0 else []


def _port_state(names: list[str]) -> dict:  # type: ignore[type-arg]
    """{port: {"ipv4": ["a.b.c.d/len", …], "ipv6_ll": [...], "mtu": int}} from ``ip -j addr``."""
    out = {}
    for link in _ip_json("addr", "show"):
        name = link.get("ifname")
        if name not in names:
            continue
        v4 = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"]
        ll = [a["local"] for a in link.get("addr_info", [])
              if a.get("family") == "inet6" and a.get("scope") == "link"]
        out[name] = {"ipv4": v4, "ipv6_ll": ll, "mtu": link.get("mtu")}
    return out


def _peer_macs(port: str, addrs: list[str]) -> list[str]:
    """The MACs behind ``addrs`` as this port's neighbour table learnt them: a unicast echo to each first makes the
    kernel resolve it on this link (neighbour discovery), so the entry holds the MAC of the interface that
    answered — the port at the cable's other end, whichever of its node's addresses it replied from."""
    for a in addrs:
        _probe_peers(port, set(), wait_s=0.3, dest=a)
    return sorted({str(n["lladdr"]).lower() for n in _ip_json("-6", "neigh", "show", "dev", port)
                   if n.get("lladdr") and str(n.get("dst", "")).split("%")[0] in addrs})


def _probe_peers(port: str, own: set, wait_s: float = 0.6, dest: str = "ff02::1") -> list[str]:  # type: ignore[type-arg]
    """Link-local addresses that answer an ICMPv6 echo to all-nodes (ff02::1, or ``dest``) on ``port``: who is on
    the other end of the cable (or the switch). Needs root (raw socket) or the unprivileged ICMP socket; []
    when neither."""
    import select
    import socket
    import struct
    import time

    try:
        idx = socket.if_nametoindex(port)
    except OSError:
        return []
    sock = None
    for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
        try:
            sock = socket.socket(socket.AF_INET6, kind, socket.IPPROTO_ICMPV6)
            break
        except OSError:
            continue
    if sock is None:
        return []
    seen: list[str] = []
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, port.encode())
        ident = 0x5350
        sock.sendto(struct.pack("!BBHHH", 128, 0, 0, ident, 1) + b"sparkserve-setup", (dest, 0, 0, idx))
        end = time.monotonic() + wait_s
        while (left := end - time.monotonic()) > 0:
            r, _, _ = select.select([sock], [], [], left)
            if not r:
                break
            data, addr = sock.recvfrom(2048)
            src = addr[0].split("%")[0]
            if data[:1] == b"\x81" and src not in own and src not in seen:
                seen.append(src)
    except OSError:
        return seen
    finally:
        sock.close()
    return seen


def node_discover(args: dict) -> dict:  # type: ignore[type-arg]
    """Read-only facts for `setup`: the sysfs files (netdevs here, RDMA devices under ``sysfs_root``), every
    port's addresses, the peers' MACs seen on each port with a carrier, docker and its runtimes, the user's
    groups, swappiness, free disk at the model path, the HF cache, netplan, and sparkserve's own state."""
    import grp
    import json
    import os
    import pwd
    import shutil
    import socket
    import subprocess

    files = {k: v for k, v in node_read_sysfs("/sys").items() if k.startswith("class/net")}  # noqa: F821
    root = str(args.get("sysfs_root") or "/sys")
    files.update({k: v for k, v in node_read_sysfs(root).items()  # noqa: F821
                  if k.startswith("class/infiniband")})
    names = [n for n in files.get("class/net/", "").split("\n") if n and n != "lo"]
    ports = _port_state(names)
    own = {a for p in ports.values() for a in p["ipv6_ll"]}
    def probe(name: str) -> list[str]:
        # a link that just came up: its (and the peer's) link-local address is tentative until duplicate
        # address detection ends (~1-2 s), and a tentative address neither sends nor answers: ask again
        # and a busy node answers late: two rounds always (their union), more while nobody answered
        found: list[str] = []
        for k in range(5):
            found += [a for a in _probe_peers(name, own, wait_s=0.8) if a not in found]
            if k >= 1 and found:
                break
        return _peer_macs(name, found)

    from concurrent.futures import ThreadPoolExecutor

    linked = [n for n in names if files.get(f"class/net/{n}/carrier") == "1" and ports.get(n, {}).get("ipv6_ll")]
    with ThreadPoolExecutor(max(1, len(linked))) as pool:
        peers = dict(zip(linked, pool.map(probe, linked), strict=True))
    user = pwd.getpwuid(os.geteuid()).pw_name if not args.get("user") else str(args["user"])
    try:
        groups = sorted({g.gr_name for g in grp.getgrall() if user in g.gr_mem}
                        | {grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name})
    except KeyError:
        groups = []
    docker = {"cli": bool(shutil.which("docker")), "server": "", "runtimes": [], "error": ""}
    if docker["cli"]:
        try:
            p = subprocess.run(["docker", "info", "--format", "{{json .}}"], capture_output=True, text=True,
                               timeout=20)
            if p.returncode == 0:
                info = json.loads(p.stdout)
                docker["server"] = info.get("ServerVersion", "")
                docker["runtimes"] = sorted(info.get("Runtimes") or {})
            else:
                docker["error"] = (p.stderr.strip().splitlines() or ["docker info failed"])[-1]
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            docker["error"] = str(e)

    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""

    model_path = os.path.expanduser(str(args.get("model_path") or "~"))
    probe = model_path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe or "/")
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    repos = sorted(n for n in os.listdir(hub) if n.startswith("models--")) if os.path.isdir(hub) else []
    state = None
    try:
        with open(STATE) as f:
            state = json.load(f)
    except (OSError, ValueError):
        pass
    return {
        "hostname": socket.gethostname(), "user": user, "uid": os.geteuid(), "groups": groups,
        "sysfs": files, "ports": ports, "peers": peers, "docker": docker,
        "swappiness": read("/proc/sys/vm/swappiness"),
        "disk": {"path": probe, "free_bytes": st.f_bavail * st.f_frsize},
        "hf_cache": {"path": hub, "exists": os.path.isdir(hub), "repos": repos,
                     "token": bool(os.environ.get("HF_TOKEN") or os.path.exists(os.path.join(
                         os.path.dirname(hub), "token")))},
        "netplan": bool(shutil.which("netplan")), "netplan_dir": os.path.isdir("/etc/netplan"),
        "state": state,
    }


def _run(argv: list[str]) -> None:
    import subprocess

    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(p.stderr or p.stdout).strip()}")


def _write(path: str, text: str, mode: int) -> None:
    import os

    tmp = path + ".sparkserve-tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _restore(state: dict) -> list[str]:  # type: ignore[type-arg]
    """Undo everything ``state`` lists: ports back to their addresses and MTU, files and directories removed,
    the docker group as it was. Returns what it could not do (best effort: every step is tried)."""
    import os

    problems = []
    for port, before in state.get("ports", {}).items():
        now = _port_state([port]).get(port)
        if now is None:
            problems.append(f"{port}: gone")
            continue
        try:
            for a in now["ipv4"]:
                if a not in before["ipv4"]:
                    _run(["ip", "addr", "del", a, "dev", port])
            for a in before["ipv4"]:
                if a not in now["ipv4"]:
                    _run(["ip", "addr", "add", a, "dev", port])
            if before.get("mtu") and before["mtu"] != now["mtu"]:
                _run(["ip", "link", "set", "dev", port, "mtu", str(before["mtu"])])
        except RuntimeError as e:
            problems.append(str(e))
    if state.get("docker_group_added"):
        try:
            _run(["gpasswd", "-d", state["docker_group_added"], "docker"])
        except (RuntimeError, OSError) as e:
            problems.append(str(e))
    for path in state.get("files", []):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            problems.append(f"{path}: {e.strerror}")
    for path, text in state.get("rewrite", {}).items():
        try:
            _write(path, text, 0o644)
        except OSError as e:
            problems.append(f"{path}: {e.strerror}")
    for d in reversed(state.get("dirs", [])):
        try:
            os.rmdir(d)
        except OSError as e:
            problems.append(f"{d}: {e.strerror}")
    return problems


def _watchdog(token: str, deadline_s: float, state: dict) -> None:  # type: ignore[type-arg]
    """Detached: at the deadline, undo this apply unless the pending file (holding ``token``) is gone."""
    import json
    import os
    import time

    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    fd = os.open(os.devnull, os.O_RDWR)
    for k in (0, 1, 2):
        os.dup2(fd, k)
    try:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            time.sleep(0.2)
            try:
                with open(PENDING) as f:
                    if f.read().strip() != token:
                        os._exit(0)
            except FileNotFoundError:
                os._exit(0)
        problems = _restore(state)
        with open(ROLLBACK_NOTE, "w") as f:
            json.dump({"token": token, "at": time.time(), "problems": problems}, f)
    finally:
        os._exit(0)


def node_apply(args: dict) -> dict:  # type: ignore[type-arg]
    """Apply the plan ``args`` (ports: {name: {"address": "a.b.c.d/24", "remove": [...]}}, mtu, netplan text,
    sysctl text or "", docker_user or "", token, rollback_s) and return what it wrote. The watchdog undoes it
    at ``rollback_s`` unless confirmed."""
    import grp
    import json
    import os
    import shutil

    try:
        with open(STATE) as f:
            previous_text = f.read()
        previous = json.loads(previous_text)
    except (OSError, ValueError):
        previous_text, previous = "", {}
    before = _port_state(list(args["ports"]))
    for port in args["ports"]:
        if port not in before:
            raise RuntimeError(f"{port}: no such interface")
    writes = [(path, text, mode) for path, text, mode in (
        (NETPLAN_FILE, args["netplan"], 0o600), (SYSCTL_FILE, args.get("sysctl", ""), 0o644)) if text]
    for path, _, _ in writes:
        if os.path.exists(path) and path not in previous.get("files", []):
            raise RuntimeError(f"{path}: exists and is not sparkserve's")
    user = args.get("docker_user") or ""
    add_user = ""
    if user and user != "root":
        try:
            if user not in grp.getgrnam("docker").gr_mem:
                add_user = user
        except KeyError:
            pass
    dirs = [d for d in (STATE_DIR, os.path.dirname(NETPLAN_FILE), os.path.dirname(SYSCTL_FILE))
            if not os.path.isdir(d)]
    for d in dirs:
        os.makedirs(d, mode=0o755)
    new_files = [p for p in [*(w[0] for w in writes), STATE] if p not in previous.get("files", [])]
    # what the watchdog undoes: this apply only (an earlier, confirmed apply's state file comes back as it was)
    rollback = {"ports": {p: {"ipv4": before[p]["ipv4"], "mtu": before[p]["mtu"]} for p in args["ports"]},
                "files": [PENDING, *new_files], "dirs": dirs, "docker_group_added": add_user,
                "rewrite": {STATE: previous_text} if previous_text else {}}
    _write(PENDING, args["token"], 0o600)
    _watchdog(args["token"], float(args["rollback_s"]), rollback)
    try:
        for port, want in args["ports"].items():
            for a in want.get("remove", []):
                if a in before[port]["ipv4"]:
                    _run(["ip", "addr", "del", a, "dev", port])
            _run(["ip", "link", "set", "dev", port, "mtu", str(args["mtu"])])
            if want["address"] not in before[port]["ipv4"]:
                _run(["ip", "addr", "add", want["address"], "dev", port])
            _run(["ip", "link", "set", "dev", port, "up"])
        for path, text, mode in writes:
            _write(path, text, mode)
        if shutil.which("netplan") and args["netplan"]:
            _run(["netplan", "generate"])  # the file is valid and takes effect at boot; the live state came from ip
        if add_user:
            _run(["usermod", "-aG", "docker", add_user])
    except BaseException:  # nothing half-done: this apply undone now (the watchdog then finds nothing pending)
        _restore(rollback)
        raise
    state = {
        "version": 1,
        "ports": {**rollback["ports"], **previous.get("ports", {})},  # the first-seen state of each port wins
        "files": sorted({*previous.get("files", []), *new_files}),
        "dirs": previous.get("dirs", []) + dirs,
        "docker_group_added": previous.get("docker_group_added") or add_user,
    }
    _write(STATE, json.dumps(state, indent=2) + "\n", 0o644)
    return {"written": sorted({*(w[0] for w in writes), STATE}), "dirs": dirs, "state": state}


def node_confirm(args: dict) -> dict:  # type: ignore[type-arg]
    """The control machine reached the node again after the apply: the watchdog stands down."""
    import os

    try:
        with open(PENDING) as f:
            if f.read().strip() != args["token"]:
                return {"confirmed": False, "reason": "another apply is pending"}
        os.unlink(PENDING)
    except FileNotFoundError:
        return {"confirmed": False, "reason": "rolled back already (the deadline passed)"}
    return {"confirmed": True}


def node_undo(args: dict) -> dict:  # type: ignore[type-arg]
    """Everything sparkserve's setup wrote on this node removed, the ports as they were before it."""
    import json

    try:
        with open(STATE) as f:
            state = json.load(f)
    except FileNotFoundError:
        return {"undone": False, "removed": [], "problems": []}
    except ValueError:
        return {"undone": False, "removed": [], "problems": [f"{STATE}: not JSON"]}
    problems = _restore(state)
    return {"undone": not problems, "removed": state.get("files", []) + state.get("dirs", []),
            "problems": problems}


def node_rollback_note(args: dict) -> dict:  # type: ignore[type-arg]
    """What the watchdog did, if it did (read, then removed)."""
    import json
    import os

    try:
        with open(ROLLBACK_NOTE) as f:
            note = json.load(f)
        os.unlink(ROLLBACK_NOTE)
        return note
    except (OSError, ValueError):
        return {}

