"""The rig's nodes are real: SSH with verified host keys, their own Docker daemon, their own filesystem view."""

from __future__ import annotations

import subprocess

import paramiko
import pytest

from sparkserve.config import load_config

pytestmark = pytest.mark.rig


def ssh(rig, node, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(rig.ssh_argv(node, *argv), capture_output=True, text=True, timeout=30)


def test_paramiko_connects_with_the_rig_key_and_rejects_unknown_hosts(rig) -> None:
    for n in rig.nodes:
        c = paramiko.SSHClient()
        c.load_host_keys(str(rig.known_hosts))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(n.host, port=n.port, username=rig.user, key_filename=str(rig.identity_file), look_for_keys=False,
                  allow_agent=False, timeout=10)
        _, out, _ = c.exec_command("echo $SSRIG_NODE $DOCKER_HOST")
        assert out.read().decode().split() == [n.name, n.docker_url]
        c.close()
    stranger = paramiko.SSHClient()
    stranger.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        stranger.connect(rig.head.host, port=rig.head.port, username="root", key_filename=str(rig.identity_file),
                         look_for_keys=False, allow_agent=False, timeout=10)


def test_password_login_is_refused(rig) -> None:
    p = subprocess.run(["/usr/bin/ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={rig.known_hosts}",
                        "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no", "-p", str(rig.head.port),
                        f"root@{rig.head.host}", "true"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "Permission denied" in p.stderr


def test_each_node_has_its_own_docker_daemon_and_the_same_emulator_image(rig, rig_docker) -> None:
    ids = {name: c.images.get(rig.image_ref).id for name, c in rig_docker.items()}
    assert set(ids.values()) == {rig.image_id}
    roots = {name: c.info()["DockerRootDir"] for name, c in rig_docker.items()}
    assert len(set(roots.values())) == len(rig.nodes)
    for n in rig.nodes:  # docker over SSH reaches that node's daemon
        p = ssh(rig, n, "docker", "info", "--format", "{{.DockerRootDir}}")
        assert p.returncode == 0 and p.stdout.strip() == roots[n.name]


def test_node_paths_are_node_local(rig, pristine_models) -> None:
    a, b = rig.nodes[0], rig.nodes[1]
    only_a = f"{rig.node_root}/only-on-{a.name}"
    a.host_path(only_a).write_text("a\n")
    try:
        assert ssh(rig, a, "cat", only_a).stdout == "a\n"
        assert ssh(rig, b, "test", "-e", only_a).returncode == 1
    finally:
        a.host_path(only_a).unlink()
    drafter_cfg = f"{rig.models['drafter']}/config.json"
    b.host_path(drafter_cfg).write_text(b.host_path(drafter_cfg).read_text().replace("154856", "154857"))
    sums = {n.name: ssh(rig, n, "sha256sum", drafter_cfg).stdout.split()[0] for n in rig.nodes[:2]}
    assert sums[a.name] != sums[b.name]


def test_container_bind_mounts_see_their_own_nodes_files(rig, rig_docker, pristine_models) -> None:
    b = rig.nodes[1]
    cfg = f"{rig.models['drafter']}/config.json"
    b.host_path(cfg).write_text('{"node": "b"}\n')
    seen = {}
    for n in rig.nodes[:2]:
        out = rig_docker[n.name].containers.run(
            rig.image_ref, ["python3", "-c", "print(open('/models/drafter/config.json').read()[:40])"],
            remove=True, network_mode="none",
            volumes={rig.models["drafter"]: {"bind": "/models/drafter", "mode": "ro"}})
        seen[n.name] = out.decode()
    assert seen[b.name].startswith('{"node": "b"}') and '"architectures"' in seen[rig.nodes[0].name]


def test_fake_sysfs_has_twin_hcas_with_a_different_rocev2_gid_per_node(rig) -> None:
    found = {}
    for n in rig.nodes:
        root = f"{rig.node_root}/sys/class/infiniband"
        p = ssh(rig, n, "sh", "-c", f"ls {root}; cat {root}/rocep1s0f1/ports/1/state "
                                    f"{root}/rocep1s0f1/ports/1/gid_attrs/types/{n.gid_index} "
                                    f"{root}/rocep1s0f1/ports/1/gids/{n.gid_index} "
                                    f"{rig.node_root}/sys/class/net/enp1s0f1np1/mtu")
        lines = p.stdout.split("\n")
        assert lines[:2] == ["roceP2p1s0f1", "rocep1s0f1"] and lines[2] == "4: ACTIVE" and lines[3] == "RoCE v2"
        octets = [int(x) for x in n.fabric_ip.split(".")]
        assert lines[4].endswith(f"ffff:{octets[0]:02x}{octets[1]:02x}:{octets[2]:02x}{octets[3]:02x}")
        assert lines[5] == "9000"
        found[n.name] = n.gid_index
    assert len(set(found.values())) == len(found)


def test_rig_yaml_is_a_valid_sparkserve_config_for_the_rig(rig) -> None:
    cfg = load_config(rig.rig_yaml)
    assert [(n.name, n.host, n.port, n.fabric_ip) for n in cfg.nodes] == [
        (n.name, n.host, n.port, n.fabric_ip) for n in rig.nodes]
    assert cfg.image.ref == rig.image_ref and str(cfg.drafter.path) == rig.models["drafter"]
    assert cfg.container.gpus == "none" and cfg.container.rdma_devices == []
    assert str(cfg.fabric.sysfs_root) == f"{rig.node_root}/sys" and cfg.serve.host == rig.head.host
    assert cfg.gates.mask_token_id == 154856 and cfg.gates.pool_tokens
