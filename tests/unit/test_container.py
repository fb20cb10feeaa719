"""ContainerSpec and its two docker renderings (``docker run`` argv, docker-SDK kwargs). Pure: no daemon."""

from __future__ import annotations

from pathlib import Path

import docker.types
import pytest
from _fixtures import config_file

from sparkserve.config import load_config
from sparkserve.plan.build import build_plan
from sparkserve.plan.container import LABEL_FINGERPRINT, ContainerSpec, Mount, restart_policy

BASE = ContainerSpec(
    node="spark-b", host="10.0.0.2", rank=1, role="follower", name="sparkserve-r1-spark-b", image="img:1",
    command=["vllm", "serve", "/models/target", "--headless"], env={"A": "1"},
    mounts=[Mount(source="/s", target="/t")], labels={"l": "1"}, network_mode="host", ipc_mode="host",
    shm_size=2**30, ulimits={"memlock": (-1, -1)}, cap_add=["IPC_LOCK"], devices=["/dev/infiniband"],
    gpus=True, exec_after_join=None, restart="no", stop_timeout=30, secret_env={},
)

# A different value for every field docker must receive: changing it must change BOTH renderings.
VARIANTS: dict[str, object] = {
    "name": "sparkserve-r1-other",
    "image": "img:2",
    "command": ["ray", "start", "--block"],
    "env": {"A": "2"},
    "mounts": [Mount(source="/s", target="/t", read_only=False)],
    "labels": {"l": "2"},
    "network_mode": "bridge",
    "ipc_mode": "private",
    "shm_size": 2**20,
    "memory": 118 * 2**30,
    "ulimits": {"nofile": (4096, 4096)},
    "cap_add": ["SYS_NICE"],
    "devices": ["/dev/other"],
    "gpus": False,
    "restart": "on-failure:3",
    "stop_timeout": 99,
    "secret_env": {"VLLM_API_KEY": "sk-x"},
}
# Fields that are not docker's business: changing them must change NEITHER rendering.
NOT_RENDERED: dict[str, object] = {
    "node": "spark-c",  # which node runs it: the caller picks the node (its labels carry the name)
    "host": "10.0.0.3",
    "rank": 2,  # carried by the labels, as data of the plan
    "role": "head",
    "exec_after_join": ["vllm", "serve", "/models/target"],  # exec'd by `up` after the ray workers join
    "make_dirs": ["/srv/other"],  # made on the node before the rank starts (engine.run, the launcher)
}


def _renderings(spec: ContainerSpec) -> tuple[list[str], dict[str, dict[str, object]]]:
    return spec.docker_run_argv(), spec.docker_sdk_kwargs()


def test_both_renderings_carry_every_field_of_the_spec() -> None:
    fields = set(ContainerSpec.model_fields)
    assert set(VARIANTS) | set(NOT_RENDERED) == fields, (
        "a ContainerSpec field is new: render it in docker_run_argv AND docker_sdk_kwargs and add a variant "
        "to VARIANTS (or explain in NOT_RENDERED why docker never sees it)")
    argv, sdk = _renderings(BASE)
    for name, value in VARIANTS.items():
        assert getattr(BASE, name) != value, name
        argv2, sdk2 = _renderings(BASE.model_copy(update={name: value}))
        assert argv2 != argv, f"docker_run_argv ignores ContainerSpec.{name}"
        assert sdk2 != sdk, f"docker_sdk_kwargs ignores ContainerSpec.{name}"
    for name, value in NOT_RENDERED.items():
        assert _renderings(BASE.model_copy(update={name: value})) == (argv, sdk), name


def test_sdk_kwargs_are_what_docker_py_builds_its_request_from() -> None:
    spec = BASE.model_copy(update={"restart": "on-failure:3", "stop_timeout": 77,
                                   "secret_env": {"VLLM_API_KEY": "sk-x"}})
    kw = spec.docker_sdk_kwargs()
    host = docker.types.HostConfig(version="1.41", **kw["host_config"])
    create = {k: v for k, v in kw["create"].items() if k != "name"}  # `name` is a query parameter
    config = docker.types.ContainerConfig(version="1.41", host_config=host, **create)
    assert config["StopTimeout"] == 77 and config["HostConfig"]["RestartPolicy"] == {
        "Name": "on-failure", "MaximumRetryCount": 3}
    assert config["Entrypoint"] == ["vllm"] and config["Cmd"] == ["serve", "/models/target", "--headless"]
    assert sorted(config["Env"]) == ["A=1", "VLLM_API_KEY=sk-x"]  # docker gets the secret's value
    assert host["Mounts"] == [docker.types.Mount(target="/t", source="/s", type="bind", read_only=True)]
    assert host["Ulimits"] == [docker.types.Ulimit(name="memlock", soft=-1, hard=-1)]
    assert host["DeviceRequests"] == [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    assert host["Devices"] == [{"PathOnHost": "/dev/infiniband", "PathInContainer": "/dev/infiniband",
                                "CgroupPermissions": "rwm"}]
    assert (host["NetworkMode"], host["IpcMode"], host["ShmSize"], host["CapAdd"]) == (
        "host", "host", 2**30, ["IPC_LOCK"])


@pytest.mark.parametrize(("text", "policy"), [("no", {"Name": "no"}), ("always", {"Name": "always"}),
                                              ("on-failure:5", {"Name": "on-failure", "MaximumRetryCount": 5})])
def test_restart_policy_speaks_docker_runs_syntax(text: str, policy: dict[str, object]) -> None:
    assert restart_policy(text) == policy


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_docker_run_argv_carries_the_whole_spec(tmp_path: Path) -> None:
    cfg = load_config(config_file(tmp_path / "c.yaml", {}))
    s = build_plan(cfg).specs[1]
    argv = s.docker_run_argv()
    assert argv[:3] == ["docker", "run", "-d"] and _value(argv, "--name") == "sparkserve-r1-spark-b"
    for flag in ("--network=host", "--ipc=host", "--gpus"):
        assert flag in argv
    # the card's --memory=118g and --ulimit core=0; no --shm-size (docker ignores it under --ipc=host)
    assert "--shm-size" not in argv and _value(argv, "--memory") == "118g"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--ulimit"] == ["memlock=-1:-1", "core=0:0"]
    sdk = s.docker_sdk_kwargs()["host_config"]
    assert sdk["mem_limit"] == 118 * 2**30 and sdk["shm_size"] is None
    assert {"name": "core", "soft": 0, "hard": 0} in sdk["ulimits"]
    assert _value(argv, "--cap-add") == "IPC_LOCK" and _value(argv, "--device") == "/dev/infiniband"
    assert f"{LABEL_FINGERPRINT}={cfg.fingerprint()}" in argv and _value(argv, "--restart") == "no"
    assert _value(argv, "--stop-timeout") == str(cfg.container.stop_timeout_s)
    assert "-e" in argv and "VLLM_HOST_IP=192.168.200.2" in argv
    i = argv.index("--entrypoint")
    assert argv[i + 1:i + 3] == ["vllm", cfg.image.ref] and argv[i + 3:] == s.command[1:]


def test_mount_arg_quotes_commas_and_quotes_for_dockers_csv() -> None:
    assert Mount(source="/a b", target="/t").mount_arg() == "type=bind,source=/a b,target=/t,readonly"
    assert Mount(source='/a,"b', target="/t", read_only=False).mount_arg() == \
        'type=bind,"source=/a,""b",target=/t'
