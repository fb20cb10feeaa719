#!/usr/bin/env python3
"""`sparkserve service install` across a reboot, on the rig: a control machine with systemd as PID 1.

    .venv/bin/python bench/bench_service_reboot.py [--scope system|user|both] [--keep]

Why it is a bench script and not a test in `scripts/test` (issue 45): the CI machine (root on Debian 12, no
systemd as init, docker installed by scripts/setup) can host it only through a rig node's dockerd, and then
(1) it needs a Debian root filesystem with systemd and docker.io, fetched from the Debian mirror with debootstrap
(≈ 730 MB unpacked, minutes; `scripts/test` runs from the rig's cache); (2) systemd as PID 1 needs a container
holding every capability this machine has (``--privileged`` itself fails in a sandbox that lacks
CAP_SYS_RESOURCE), and the container must share the machine's network namespace to reach the rig nodes on
127.0.0.x — systemd, udev and a second dockerd with those capabilities in the CI machine's own network namespace
are what the test rules forbid ("never touch the machine's own interfaces"); masking their units before the first
boot is a mitigation, not a guarantee; (3) each scope costs two systemd boots, three stack boots with their gates
and an outage (≈ 3 min): a quarter of the suite's 25-minute budget on 2 cores for both scopes.

What it does, per scope:

1. A root filesystem (debootstrap bookworm: systemd, dbus, python3, docker.io; cached under ``$SSRIG_DIR/sysd``),
   imported into node-a's dockerd as ``sparkserve-sysd:bookworm`` (``container=docker``, CMD ``/sbin/init``).
2. The control container ``<rig>-sysd-ctl`` on node-a's dockerd: every capability held, host network, ``/run``
   on tmpfs; this
   checkout and sparkserve's venv bind-mounted read-only (a ``.pth`` file puts them on the container's Python);
   the units that would touch the host masked in the root filesystem before its first boot (udev, sysctl,
   modules, binfmt, getty, networkd, resolved, timesyncd); its dockerd with ``"bridge": "none", "iptables": false``.
3. ``sparkserve service install --scope system`` (as root), or ``--scope user`` as a user ``bench`` (lingering
   turned on by `install`).
4. Reboot 1: the stack is taken down (the nodes lost power too), the container is restarted (``docker restart``:
   SIGRTMIN+3, systemd's shutdown, a fresh boot). Checked: the unit is active; it was ordered after
   ``network-online.target`` and ``docker.service`` and started after both were up (system), or its
   ``ExecStartPre`` (`service wait`) ran (user); the head serves again and the unit's journal says the gates
   passed. Measured: boot (container start) to serving.
5. Reboot 2 with docker stopped: node-b's dockerd is stopped, the stack taken down, the container restarted; the
   unit must keep trying (never ``failed``, never exit 1 = gave up) while node-b has no docker; node-b's dockerd is
   started again after ``--outage`` seconds; the stack must serve again. Measured: dockerd back to serving.

The container and the image are removed at the end unless ``--keep``. Holds the rig's test lock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import docker
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rig"))

import rig as riglib  # noqa: E402

IMAGE = "sparkserve-sysd:bookworm"
# libpam-systemd: pam_systemd gives a lingering user's manager its XDG_RUNTIME_DIR (without it user@.service fails)
PACKAGES = ("systemd,systemd-sysv,dbus,libpam-systemd,python3,docker.io,openssh-client,iproute2,procps,"
            "ca-certificates")
UNIT = "sparkserve-supervise.service"
# units that would act on the host from a privileged container in its network namespace
MASK = ["systemd-udevd.service", "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
        "systemd-udev-trigger.service", "systemd-udev-settle.service", "systemd-sysctl.service",
        "systemd-modules-load.service", "systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount",
        "systemd-networkd.service", "systemd-resolved.service", "systemd-timesyncd.service", "getty@tty1.service",
        "serial-getty@console.service", "console-getty.service", "systemd-remount-fs.service",
        "sys-kernel-debug.mount", "sys-kernel-tracing.mount", "sys-kernel-config.mount",
        "sys-fs-fuse-connections.mount", "dev-hugepages.mount", "dev-mqueue.mount", "systemd-random-seed.service"]
DAEMON_JSON = json.dumps({"bridge": "none", "iptables": False, "ip-masq": False, "storage-driver": "vfs"})
VENV_SITE = next((REPO / ".venv").resolve().glob("lib/python3*/site-packages"))


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def rootfs_tar(work: Path) -> Path:
    """The root filesystem as a tar (built once with debootstrap; cached)."""
    tar = work / "sysd-bookworm.tar"
    if tar.exists():
        return tar
    tmp = work / "rootfs"
    if not (tmp / "sbin" / "init").exists():
        shutil.rmtree(tmp, ignore_errors=True)
        say(f"debootstrap bookworm with {PACKAGES} (once; cached in {work})")
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(tmp)],
                       check=True)
    if not list(tmp.glob("lib/*/security/pam_systemd.so")):  # a root filesystem from before libpam-systemd
        shutil.copy("/etc/resolv.conf", tmp / "etc" / "resolv.conf")
        for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "libpam-systemd"]):
            subprocess.run(["chroot", str(tmp), *argv], check=True)
    # before its first boot: the units that would act on the host masked, docker without bridge or iptables
    for unit in MASK:
        link = tmp / "etc" / "systemd" / "system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (tmp / "etc" / "docker").mkdir(parents=True, exist_ok=True)
    (tmp / "etc" / "docker" / "daemon.json").write_text(DAEMON_JSON)
    subprocess.run(["tar", "-C", str(tmp), "--numeric-owner", "-cf", str(tar) + ".part", "."], check=True)
    os.replace(str(tar) + ".part", tar)
    return tar


def ensure_image(client: docker.DockerClient, tar: Path) -> None:
    try:
        client.images.get(IMAGE)
        return
    except docker.errors.ImageNotFound:
        pass
    say(f"importing {tar} as {IMAGE}")
    repo, tag = IMAGE.split(":")
    client.api.import_image(src=str(tar), repository=repo, tag=tag,
                            changes=["ENV container=docker", 'CMD ["/sbin/init"]'])


def nodes_host(info: dict) -> str:
    """The head node's address (the rig's own loopback address: the exporter listens there, not on 127.0.0.1)."""
    return riglib.nodes_from_info(info)[0].host


def prepare(ctl: Path, info: dict, *, scope: str) -> Path:
    """The control container's own files: the stack's config, the .pth, docker's daemon.json, the masks."""
    data = yaml.safe_load(Path(info["rig_yaml"]).read_text())
    data["supervise"] = {"interval_s": 2, "canary_deadline_s": 10, "backoff_s": 5, "backoff_max_s": 20,
                         "max_restarts": 50, "budget_window_s": 3600,
                         "meminfo_path": "/srv/spark/proc/meminfo", "kmsg_path": "/srv/spark/proc/kmsg",
                         "listen": f"{nodes_host(info)}:9345"}
    if scope == "user":  # the user's own copy of the rig key (ssh refuses a key others can read)
        data["ssh"]["identity_file"] = "/home/bench/.ssh/id_ed25519"
        data["ssh"]["known_hosts"] = "/home/bench/.ssh/known_hosts"
    (ctl / "etc").mkdir(parents=True, exist_ok=True)
    cfg = ctl / "etc" / "config.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    (ctl / "etc" / "sparkserve-bench.pth").write_text(f"{REPO}\n{VENV_SITE}\n")
    return cfg


def dexec(c, cmd: str, *, user: str = "root", check: bool = True) -> str:
    rc, out = c.exec_run(["sh", "-c", cmd], user=user, environment={"LANG": "C.UTF-8"})
    text = out.decode(errors="replace")
    if check and rc != 0:
        raise RuntimeError(f"`{cmd}` in the control container exited {rc}:\n{text}")
    return text


def wait(pred, what: str, timeout: float, every: float = 1.0):
    t0 = time.monotonic()
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def gates_ok(journal: str) -> bool:
    """This boot's journal of the unit says every gate passed (the `up` inside `supervise --up`)."""
    lines = [ln for ln in journal.splitlines() if " gate " in ln and (": ok —" in ln or ": FAIL —" in ln)]
    return bool(lines) and not any(": FAIL —" in ln for ln in lines)


def ready(c, scope: str, url: str) -> bool:
    """Serving with its gates passed: the unit is active (Type=notify: READY=1 comes after `up` and its gates)
    and the head answers."""
    return unit_show(c, scope, "ActiveState").get("ActiveState") == "active" and serving(url)


def serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def start_container(client, ctl: Path, info: dict, name: str):
    ssh_dir = str(Path(info["rig_yaml"]).parent / "ssh")
    vols = {str(REPO): {"bind": str(REPO), "mode": "ro"}, str(VENV_SITE): {"bind": str(VENV_SITE), "mode": "ro"},
            ssh_dir: {"bind": ssh_dir, "mode": "ro"}, str(ctl / "etc"): {"bind": "/etc/sparkserve-bench",
                                                                        "mode": "ro"}}
    vols["/sys/fs/cgroup"] = {"bind": "/sys/fs/cgroup", "mode": "rw"}  # systemd's own cgroup tree (v1 here)
    # every capability this machine holds (``--privileged`` asks for all of them, CAP_SYS_RESOURCE too, which a
    # sandboxed CI machine may lack: runc then fails "unable to apply caps")
    c = client.containers.run(IMAGE, name=name, detach=True, cap_add=held_caps(), network_mode="host",
                              security_opt=["seccomp=unconfined", "apparmor=unconfined"], devices=["/dev/fuse"]
                              if os.path.exists("/dev/fuse") else [],
                              hostname="sysd-ctl", tmpfs={"/run": "", "/run/lock": "", "/tmp": ""}, volumes=vols,
                              environment={"container": "docker"}, stop_signal="SIGRTMIN+3")
    return c


CAPS = (  # capability(7) numbering
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)


def held_caps() -> list[str]:
    """The capabilities in this process's bounding set, by name (capability(7) order)."""
    bnd = int(next(ln.split()[1] for ln in Path("/proc/self/status").read_text().splitlines()
                   if ln.startswith("CapBnd:")), 16)
    return [name for i, name in enumerate(CAPS) if bnd >> i & 1 and i <= 37]  # docker 20.10 knows up to AUDIT_READ


def systemd_ready(c) -> bool:
    rc, out = c.exec_run(["systemctl", "is-system-running"])
    return out.decode().strip() in ("running", "degraded")


def setup_inside(c, scope: str) -> None:
    dexec(c, "ln -sf /etc/sparkserve-bench/sparkserve-bench.pth /usr/lib/python3/dist-packages/")
    if scope == "user":
        ssh_dir = "/home/bench/.ssh"
        dexec(c, f"set -e; id bench >/dev/null 2>&1 || useradd -m -s /bin/sh bench; mkdir -p {ssh_dir}; "
                 f"cp {riglib._ssh_dir()}/id_ed25519 {riglib._ssh_dir()}/known_hosts {ssh_dir}/; "
                 f"chown -R bench: /home/bench; chmod 700 {ssh_dir}; chmod 600 {ssh_dir}/id_ed25519")


def install(c, scope: str) -> str:
    cfg = "/etc/sparkserve-bench/config.yaml"
    if scope == "system":
        return dexec(c, f"python3 -m sparkserve service install --scope system -c {cfg}")
    uid = dexec(c, "id -u bench").strip()
    dexec(c, "loginctl enable-linger bench")
    wait(lambda: dexec(c, f"test -S /run/user/{uid}/systemd/private && echo ok", check=False).strip() == "ok",
         "the bench user's manager (lingering)", 60)
    return dexec(c, f"XDG_RUNTIME_DIR=/run/user/{uid} python3 -m sparkserve service install --scope user "
                    f"-c {cfg}", user="bench")


def unit_show(c, scope: str, *props: str) -> dict[str, str]:
    if scope == "user":
        uid = dexec(c, "id -u bench").strip()
        cmd = f"XDG_RUNTIME_DIR=/run/user/{uid} systemctl --user show {UNIT} -p {','.join(props)}"
        out = dexec(c, cmd, user="bench", check=False)
    else:
        out = dexec(c, f"systemctl show {UNIT} -p {','.join(props)}", check=False)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def unit_journal(c, scope: str) -> str:
    """This boot's journal of the unit and its processes (a user unit's, read by field: `journalctl --user-unit`
    as root finds nothing of another user's manager)."""
    match = (f"_SYSTEMD_USER_UNIT={UNIT} + USER_UNIT={UNIT}" if scope == "user" else
             f"_SYSTEMD_UNIT={UNIT} + UNIT={UNIT}")
    return dexec(c, f"journalctl -b --no-pager -o short-monotonic {match}", check=False)


def stack_down(info: dict) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "sparkserve", "down", "-c", info["rig_yaml"]], env=env, cwd=REPO,
                   capture_output=True, check=False)


def reboot(c, info: dict) -> float:
    """The stack loses its nodes' power too (taken down), then the control machine reboots; returns the
    monotonic time its new boot began (the container's start)."""
    stack_down(info)
    c.restart(timeout=90)
    return time.monotonic()


def run_scope(client, info: dict, nodes, scope: str, work: Path, outage: float, keep: bool) -> dict:
    head_url = f"http://{nodes[0].host}:{yaml.safe_load(Path(info['rig_yaml']).read_text())['serve']['port']}"
    ctl = Path(tempfile.mkdtemp(prefix=f"sysd-{scope}-", dir=work))
    prepare(ctl, info, scope=scope)
    name = f"{Path(info['rig_yaml']).parent.name}-sysd-ctl"
    with contextlib.suppress(docker.errors.NotFound):
        client.containers.get(name).remove(force=True)
    c = start_container(client, ctl, info, name)
    out: dict = {"scope": scope}
    try:
        wait(lambda: systemd_ready(c), "systemd in the control container", 120)
        setup_inside(c, scope)
        say(f"[{scope}] {install(c, scope).strip().splitlines()[-1]}")
        wait(lambda: ready(c, scope, head_url), "the first serve (the unit's own `supervise --up`)", 600)

        t_boot = reboot(c, info)
        wait(lambda: systemd_ready(c), "systemd after reboot 1", 180)
        wait(lambda: ready(c, scope, head_url), "the stack serving after reboot 1", 600)
        out["boot_to_serving_s"] = round(time.monotonic() - t_boot, 1)
        show = unit_show(c, scope, "ActiveState", "After", "NRestarts", "ExecMainStartTimestampMonotonic")
        journal = unit_journal(c, scope)
        out["reboot1"] = {"active": show.get("ActiveState"), "after": show.get("After", ""),
                          "gates_passed": gates_ok(journal), "restarts": show.get("NRestarts")}
        if scope == "system":
            dock = dexec(c, "systemctl show docker.service -p ActiveEnterTimestampMonotonic").split("=", 1)[1]
            net = dexec(c, "systemctl show network-online.target -p ActiveEnterTimestampMonotonic").split("=", 1)[1]
            start = int(show.get("ExecMainStartTimestampMonotonic") or 0)
            out["reboot1"]["started_after_docker_and_network"] = start >= max(int(dock), int(net)) > 0
        else:
            pre = unit_show(c, scope, "ExecStartPre").get("ExecStartPre", "")
            out["reboot1"]["waited_for_nodes"] = "service wait" in pre and "status=0" in pre  # ExecStartPre ran
        say(f"[{scope}] reboot 1: {out['reboot1']}; boot to serving {out['boot_to_serving_s']} s")

        nb = nodes[1]
        riglib.stop_pid(riglib.read_pid(Path(nb.dir) / "dockerd.pid"), f"{nb.name} dockerd")
        t_boot = reboot(c, info)
        wait(lambda: systemd_ready(c), "systemd after reboot 2", 180)
        deadline = time.monotonic() + outage
        states = set()
        while time.monotonic() < deadline:
            states.add(unit_show(c, scope, "ActiveState").get("ActiveState", "?"))
            time.sleep(2)
        before = unit_show(c, scope, "ActiveState", "NRestarts", "ExecMainStatus")
        riglib.start_node(nb)
        t_back = time.monotonic()
        wait(lambda: ready(c, scope, head_url), "the stack serving after node-b's dockerd is back", 600)
        out["reboot2"] = {"states_during_outage": sorted(states), "during": before,
                          "gates_passed": gates_ok(unit_journal(c, scope)),
                          "never_gave_up": "failed" not in states and before.get("ExecMainStatus") != "1",
                          "docker_back_to_serving_s": round(time.monotonic() - t_back, 1),
                          "boot_to_serving_s": round(time.monotonic() - t_boot, 1)}
        say(f"[{scope}] reboot 2 (node-b's dockerd stopped {outage:.0f}s): {out['reboot2']}")
    finally:
        if not keep:
            stack_down(info)
            c.remove(force=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scope", choices=("system", "user", "both"), default="both")
    ap.add_argument("--outage", type=float, default=60.0, help="seconds node-b's dockerd stays down at reboot 2")
    ap.add_argument("--keep", action="store_true", help="leave the control container and the image")
    a = ap.parse_args()
    info = riglib.load_info()
    nodes = riglib.nodes_from_info(info)
    work = Path(info["rig_yaml"]).parent / "sysd"
    work.mkdir(parents=True, exist_ok=True)
    tar = rootfs_tar(work)
    client = docker.DockerClient(base_url=nodes[0].docker_url, version="1.41", timeout=300)
    ensure_image(client, tar)
    results = []
    with riglib.exclusive_use():
        for scope in (("system", "user") if a.scope == "both" else (a.scope,)):
            results.append(run_scope(client, info, nodes, scope, work, a.outage, a.keep))
    if not a.keep:
        client.images.remove(IMAGE, force=True)
    print(json.dumps(results, indent=1))
    ok = all(r["reboot1"]["active"] == "active" and r["reboot1"]["gates_passed"] and r["reboot2"]["never_gave_up"]
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
