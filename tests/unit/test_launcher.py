"""launch_dflash2_tp2.sh: committed = rendered, shellcheck clean, and it really runs (fake ssh + docker)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _fixtures import (
    REPO,
    DrafterSpec,
    config_file,
    install_shims,
    read_shim_log,
    write_drafter,
    write_fake_sysfs,
)

from sparkserve.config import Config, load_config
from sparkserve.errors import BadInput
from sparkserve.plan.build import build_plan
from sparkserve.plan.launcher import render_launcher, sh_word

COMMITTED = REPO / "launch_dflash2_tp2.sh"
IMAGE_ID = "sha256:feedfacecafe0123456789abcdef0123456789abcdef0123456789abcdef0123"  # the docker shim's


@pytest.fixture
def default_cfg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Config:
    for k in list(os.environ):
        if k.startswith("SPARKSERVE_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)  # no ./sparkserve.yaml: the embedded default
    return load_config()


def test_committed_launcher_equals_its_render_from_the_embedded_default(default_cfg: Config) -> None:
    rendered = render_launcher(default_cfg)
    assert COMMITTED.read_text() == rendered, (
        "launch_dflash2_tp2.sh drifted from templates/launch_dflash2_tp2.sh.j2 + the default config; "
        "re-render with `sparkserve render --launcher -o launch_dflash2_tp2.sh`")
    assert os.access(COMMITTED, os.X_OK)


def _shellcheck(path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is not installed (scripts/test installs it)"
    return subprocess.run([exe, "-x", str(path)], capture_output=True, text=True, timeout=60)


def test_committed_launcher_is_shellcheck_clean() -> None:
    p = _shellcheck(COMMITTED)
    assert p.returncode == 0, p.stdout


def test_shellcheck_clean_for_three_nodes_and_awkward_paths(tmp_path: Path) -> None:
    cfg = load_config(config_file(tmp_path / "c.yaml", {
        "nodes": [{"name": f"n{i}", "host": f"h{i}.lan", "fabric_ip": f"10.0.0.{i}"} for i in range(1, 4)],
        "serve": {"tensor_parallel_size": 3, "env": {"X": "a b $HOME `id` 'q'"}},
        "model": {"target": "/models/it's a \"target\""},
        "drafter": {"path": "/models/dr $x"},
    }))
    script = tmp_path / "l.sh"
    script.write_text(render_launcher(cfg))
    p = _shellcheck(script)
    assert p.returncode == 0, p.stdout


def test_ray_config_is_refused_with_the_field_named(tmp_path: Path) -> None:
    cfg = load_config(config_file(tmp_path / "c.yaml", {"serve": {"executor": "ray"}}))
    with pytest.raises(BadInput) as e:
        render_launcher(cfg)
    assert e.value.where == "serve.executor"


def test_sh_word_turns_the_drafter_sentinel_into_the_override_variable() -> None:
    from sparkserve.plan.launcher import _SENTINEL

    assert sh_word(f"type=bind,source={_SENTINEL},target=/models/drafter,readonly") == \
        '"type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"'
    assert sh_word('a"$b`c') == "'a\"$b`c'"
    assert sh_word("x,y") == "'x,y'"


# --- running it ------------------------------------------------------------------------------------------

class Rig:
    """A rendered launcher for a config with spaces in every path, fake ssh/docker on PATH."""

    def __init__(self, tmp: Path, nodes: int = 2, over: dict[str, Any] | None = None) -> None:
        self.tmp = tmp
        base = tmp / "with space"
        node_list = [{"name": f"spark-{c}", "host": f"spark-{c}.lan", "fabric_ip": f"192.168.200.{i + 1}",
                      "user": "ubuntu", "port": 22 + i} for i, c in enumerate("abc"[:nodes])]
        data: dict[str, Any] = {
            "nodes": node_list,
            "serve": {"tensor_parallel_size": nodes},
            "model": {"target": str(base / "target model")},
            "drafter": {"path": str(base / "default drafter")},
            "container": {"cache_root": str(base / "jit cache")},
            # pinned: detection reads each node's sysfs (test_fabric_left_on_auto_is_detected_on_each_node)
            "fabric": {"interface": "enp1s0f1np1", "hca": "rocep1s0f1", "gid_index": 3},
        }
        for k, v in (over or {}).items():
            data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
        self.cfg = load_config(config_file(tmp / "c.yaml", data))
        self.script = tmp / "launch_dflash2_tp2.sh"
        self.script.write_text(render_launcher(self.cfg))
        install_shims(tmp / "bin")
        self.log = tmp / "shim.log"

    def run(self, drafter: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        self.log.unlink(missing_ok=True)
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("SPARKSERVE_", "SHIM_")) and k not in ("GRAPHS", "EAGER", "VLLM_API_KEY")}
        e.update(PATH=f"{self.tmp / 'bin'}:{e['PATH']}", SHIM_LOG=str(self.log))
        if drafter is not None:
            e["DRAFTER_HOST_PATH"] = str(drafter)
        e.update(env)
        return subprocess.run(["bash", str(self.script)], capture_output=True, text=True, env=e, timeout=60)

    def events(self) -> list[dict[str, Any]]:
        return read_shim_log(self.log)

    def runs(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["prog"] == "docker" and e["argv"][:1] == ["run"]]

    def expected(self, drafter: Path, *, eager: bool) -> list[list[str]]:
        """The plan's docker run argvs, as `up` would build them for this drafter path."""
        variant = self.cfg.model_copy(deep=True)
        variant.serve.enforce_eager = eager
        fp = variant.fingerprint()
        variant.drafter.path = drafter
        plan = build_plan(variant, fingerprint=fp, image_id=IMAGE_ID)  # the image ID keys the caches, as in `up`
        return [s.docker_run_argv()[1:] for s in plan.start_order()]


def _drafter(tmp: Path, name: str = "my drafter v2", **spec: Any) -> Path:
    return write_drafter(tmp / "with space" / name, DrafterSpec(**spec))


def test_one_command_starts_the_follower_over_ssh_then_the_head_with_the_plans_argv(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    drafter = _drafter(tmp_path)
    p = rig.run(drafter)
    assert p.returncode == 0, p.stderr
    runs = rig.runs()
    assert [r["host"] for r in runs] == ["ubuntu@spark-b.lan", "local"]  # follower first, head last
    assert [r["argv"] for r in runs] == rig.expected(drafter, eager=False)
    mount = f"type=bind,source={drafter},target=/models/drafter,readonly"
    assert all(mount in r["argv"] for r in runs)  # a path with spaces arrives as one argument, remotely too
    ssh = [e for e in rig.events() if e["prog"] == "ssh"]
    assert ssh and all(e["opts"] == ["-o", "BatchMode=yes", "-p", "23"] for e in ssh)
    for sub in ("vllm", "flashinfer", "tilelang", "triton", "deep_gemm"):  # one dir per image ID, as `up` makes
        assert (tmp_path / "with space" / "jit cache" / "feedfacecafe" / sub).is_dir()
    assert "all 2 ranks started" in p.stderr


def test_eager_knob_renders_enforce_eager_from_the_eager_plan(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    drafter = _drafter(tmp_path)
    for env in ({"EAGER": "1"}, {"GRAPHS": "0"}):
        p = rig.run(drafter, **env)
        assert p.returncode == 0, p.stderr
        argvs = [r["argv"] for r in rig.runs()]
        assert argvs == rig.expected(drafter, eager=True)
        assert all("--enforce-eager" in a and "--compilation-config" not in a for a in argvs)


def test_graphs_is_the_default(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    drafter = _drafter(tmp_path)
    graphs = '{"cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[1,2,4,8,16,24,32]}'
    for env in ({}, {"GRAPHS": "1"}):
        p = rig.run(drafter, **env)
        assert p.returncode == 0, p.stderr
        for r in rig.runs():
            assert r["argv"][r["argv"].index("--compilation-config") + 1] == graphs
            assert "--enforce-eager" not in r["argv"]


def test_default_drafter_path_from_the_config_is_used_without_override(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    default = write_drafter(rig.cfg.drafter.path)
    p = rig.run()
    assert p.returncode == 0, p.stderr
    assert [r["argv"] for r in rig.runs()] == rig.expected(default, eager=False)


def test_three_nodes_start_both_followers_before_the_head(tmp_path: Path) -> None:
    rig = Rig(tmp_path, nodes=3)
    drafter = _drafter(tmp_path)
    p = rig.run(drafter)
    assert p.returncode == 0, p.stderr
    assert [r["host"] for r in rig.runs()] == ["ubuntu@spark-b.lan", "ubuntu@spark-c.lan", "local"]
    assert [r["argv"] for r in rig.runs()] == rig.expected(drafter, eager=False)


@pytest.mark.parametrize("reader", ["python3", "jq"])
def test_refuses_k_above_block_minus_one_for_dflash2(tmp_path: Path, reader: str) -> None:
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path, block_size=4), DRAFTER_JSON_READER=reader)
    assert p.returncode == 2
    assert "K=7" in p.stderr and "block_size is 4" in p.stderr and "at most block_size - 1 = 3" in p.stderr
    assert rig.runs() == [] and [e for e in rig.events() if e["prog"] == "ssh"] == []


@pytest.mark.parametrize("reader", ["python3", "jq"])
def test_warns_and_runs_k_below_block_minus_one_for_dflash2(tmp_path: Path, reader: str) -> None:
    # the drafter card: k=5 boots on the SM121 image (block 8); an earlier "boot-wedge" claim was wrong
    rig = Rig(tmp_path)
    drafter = _drafter(tmp_path, block_size=16)
    p = rig.run(drafter, DRAFTER_JSON_READER=reader)
    assert p.returncode == 0, p.stderr
    assert "warning: K=7 but DFlash2DraftModel's block_size is 16" in p.stderr and "k=5" in p.stderr
    assert [r["host"] for r in rig.runs()] == ["ubuntu@spark-b.lan", "local"]


@pytest.mark.parametrize("reader", ["python3", "jq"])
def test_reads_block_size_at_run_time_with_either_reader(tmp_path: Path, reader: str) -> None:
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path), DRAFTER_JSON_READER=reader)
    assert p.returncode == 0, p.stderr
    assert len(rig.runs()) == 2


def test_dflash_v1_with_another_block_only_warns(tmp_path: Path) -> None:
    """Real vLLM 0.25.1 served K=5 on a block-8 DFlash (v1) drafter: a warning, not a refusal."""
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path, name="v1", architecture="DFlashDraftModel", block_size=6))
    assert p.returncode == 0, p.stderr
    assert "warning: K=7 but the DFlash drafter's block_size is 6" in p.stderr
    assert len(rig.runs()) == 2


def test_refuses_to_start_without_mask_embedding(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path, mask_file=None))
    assert p.returncode == 2
    assert p.stderr.strip().startswith("error: ") and "mask_embedding.pt: missing" in p.stderr
    assert rig.events() == []


def test_refuses_when_a_follower_lacks_the_mask_file(tmp_path: Path) -> None:
    """The follower check runs over ssh: make the remote `test -f` fail for the follower only."""
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path), SHIM_REMOTE_TEST_FAILS="1")
    assert p.returncode == 2, p.stderr
    assert "spark-b:" in p.stderr and "mask_embedding.pt is missing there" in p.stderr
    assert rig.runs() == []


@pytest.mark.parametrize(("env", "needle"), [
    ({"GRAPHS": "yes"}, "GRAPHS: must be 0 or 1"),
    ({"EAGER": "2"}, "EAGER: must be 0 or 1"),
    ({"DRAFTER_HOST_PATH": "relative/dir"}, "must be an absolute path"),
    ({"DRAFTER_HOST_PATH": "/tmp/a,b"}, "comma or a double quote"),
    ({"DRAFTER_HOST_PATH": "/nonexistent/drafter"}, "is not a directory"),
    ({"DRAFTER_JSON_READER": "perl"}, "DRAFTER_JSON_READER"),
])
def test_bad_knobs_exit_2_with_one_line(tmp_path: Path, env: dict[str, str], needle: str) -> None:
    rig = Rig(tmp_path)
    if "DRAFTER_HOST_PATH" not in env:
        env = {**env, "DRAFTER_HOST_PATH": str(_drafter(tmp_path))}
    p = rig.run(None, **env)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], p.stderr
    assert rig.runs() == []


def test_api_key_reaches_the_head_through_the_environment_never_the_argv(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path), VLLM_API_KEY="s3cret-key")
    assert p.returncode == 0, p.stderr
    follower, head = rig.runs()
    assert head["argv"][:3] == ["run", "-e", "VLLM_API_KEY"] and head["api_key_in_env"] == "s3cret-key"
    assert "VLLM_API_KEY" not in follower["argv"]
    for e in rig.events():
        assert "s3cret-key" not in " ".join(e.get("argv", [])) + e.get("command", "")
    assert "s3cret-key" not in p.stderr + p.stdout


def test_stale_managed_ranks_are_stopped_everywhere_before_any_start(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path), SHIM_EXISTING="sparkserve-r0-spark-a=1;sparkserve-r1-spark-b=1")
    assert p.returncode == 0, p.stderr
    verbs = [(e["host"], e["argv"][0]) for e in rig.events()
             if e["prog"] == "docker" and e["argv"][0] not in ("container", "image")]  # inspections
    assert verbs[:4] == [("local", "stop"), ("local", "rm"), ("ubuntu@spark-b.lan", "stop"),
                         ("ubuntu@spark-b.lan", "rm")]
    assert verbs[4:] == [("ubuntu@spark-b.lan", "run"), ("local", "run")]
    stop = next(e for e in rig.events() if e["prog"] == "docker" and e["argv"][0] == "stop")
    assert stop["argv"] == ["stop", "-t", "30", "sparkserve-r0-spark-a"]  # graceful, never rm -f


def test_a_same_named_container_that_is_not_ours_is_left_alone(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path), SHIM_EXISTING="sparkserve-r1-spark-b=<no value>")
    assert p.returncode == 2
    assert "spark-b: a container named sparkserve-r1-spark-b exists and is not sparkserve's" in p.stderr
    docker = [e for e in rig.events() if e["prog"] == "docker"]
    assert rig.runs() == [] and not [e for e in docker if e["argv"][:1] in (["stop"], ["rm"])]


def test_a_follower_that_exits_at_once_stops_the_launch_before_the_head(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    p = rig.run(_drafter(tmp_path), SHIM_NOT_RUNNING="sparkserve-r1-spark-b")
    assert p.returncode == 3
    assert "spark-b: sparkserve-r1-spark-b is not running" in p.stderr
    assert [r["host"] for r in rig.runs()] == ["ubuntu@spark-b.lan"]


@pytest.mark.parametrize("reader", ["python3", "jq"])
@pytest.mark.parametrize(("config_text", "needle"), [
    ("{not json", "config.json: not readable JSON"),
    ('{"architectures": ["DFlash2DraftModel"], "dflash_config": {}}', "block_size is missing"),
])
def test_an_unreadable_drafter_config_is_one_line(tmp_path: Path, reader: str, config_text: str,
                                                   needle: str) -> None:
    rig = Rig(tmp_path)
    drafter = _drafter(tmp_path)
    (drafter / "config.json").write_text(config_text)
    p = rig.run(drafter, DRAFTER_JSON_READER=reader)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr


# --- fabric on auto: detected on each node at run time, by up's own rule ------------------------------------


def _without_env(argv: list[str]) -> list[str]:
    out: list[str] = []
    for i, a in enumerate(argv):
        if a == "-e" or (i and argv[i - 1] == "-e"):
            continue
        out.append(a)
    return out


def _env_of(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e" and "=" in argv[i + 1])


@pytest.mark.parametrize("twin", [False, True], ids=["one-hca", "dual-rail"])
def test_fabric_left_on_auto_is_detected_on_each_node_as_up_would(tmp_path: Path, twin: bool) -> None:
    from sparkserve.plan.fabric import resolve
    from sparkserve.plan.fabric_node import node_read_sysfs
    from sparkserve.plan.fabric_sysfs import parse_sysfs

    sysfs = write_fake_sysfs(tmp_path / "sys", twin=twin)
    rig = Rig(tmp_path, over={"fabric": {"interface": "auto", "hca": "auto", "gid_index": "auto",
                                         "sysfs_root": str(sysfs)}})
    drafter = _drafter(tmp_path)
    p = rig.run(drafter)
    assert p.returncode == 0, p.stderr
    # up's path: the probe's sysfs facts resolved by plan/fabric.py, handed to build_plan
    detected = {n.name: resolve(parse_sysfs(node_read_sysfs(str(sysfs))), rig.cfg.fabric, n.fabric_ip, node=n.name)
                .env() for n in rig.cfg.nodes}
    variant = rig.cfg.model_copy(deep=True)
    fp = variant.fingerprint()
    variant.drafter.path = drafter
    plan = build_plan(variant, fingerprint=fp, image_id=IMAGE_ID, fabric_env=detected)
    for run, spec in zip(rig.runs(), plan.start_order(), strict=True):
        assert _env_of(run["argv"]) == spec.env, spec.node  # the same env as `up`, detected values included
        assert _without_env(run["argv"]) == _without_env(spec.docker_run_argv()[1:])  # and all else, in order
    a, b = (_env_of(r["argv"]) for r in reversed(rig.runs()))  # head, follower
    if twin:  # the dual-rail rule: no global GID index, NCCL picks per HCA inside the range
        assert "NCCL_IB_GID_INDEX" not in a and a["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert (a["NCCL_IB_ROCE_VERSION_NUM"], a["NCCL_IB_ADDR_FAMILY"]) == ("2", "AF_INET")
        assert a["NCCL_IB_ADDR_RANGE"] == "192.168.200.0/23"
    else:
        assert (a["NCCL_IB_GID_INDEX"], b["NCCL_IB_GID_INDEX"]) == ("3", "5")  # per node
        assert a["NCCL_IB_HCA"] == "rocep1s0f1" and a["NCCL_IB_ADDR_RANGE"] == "192.168.200.0/24"
    assert a["NCCL_SOCKET_IFNAME"] == a["MN_IF_NAME"] == "enp1s0f1np1"
    assert "spark-b: fabric NCCL_SOCKET_IFNAME=enp1s0f1np1" in p.stderr


def test_a_node_without_its_fabric_address_stops_the_launch_before_any_start(tmp_path: Path) -> None:
    sysfs = write_fake_sysfs(tmp_path / "sys")
    rig = Rig(tmp_path, over={"nodes": [{"name": "spark-a", "host": "spark-a.lan", "fabric_ip": "192.168.200.1"},
                                        {"name": "spark-b", "host": "spark-b.lan", "fabric_ip": "192.168.200.9"}],
                              "fabric": {"interface": "auto", "hca": "auto", "gid_index": "auto",
                                         "sysfs_root": str(sysfs)}})
    p = rig.run(_drafter(tmp_path))
    assert p.returncode == 3, p.stderr
    assert "error: spark-b: fabric: no RoCE v2 GID entry for fabric_ip 192.168.200.9" in p.stderr
    assert rig.runs() == []


def test_render_refuses_auto_fabric_it_cannot_detect(tmp_path: Path) -> None:
    v6 = [{"name": c, "host": f"{c}.lan", "fabric_ip": f"fd00::{i}"} for i, c in enumerate("ab", 1)]
    cfg = load_config(config_file(tmp_path / "c.yaml", {"nodes": v6}))
    with pytest.raises(BadInput) as e:
        render_launcher(cfg)
    assert e.value.where == "fabric.interface" and "fd00::1 is not IPv4" in e.value.what
    pinned = load_config(config_file(tmp_path / "c.yaml", {
        "nodes": v6, "fabric": {"interface": "enp1s0f1np1", "hca": "rocep1s0f1", "gid_index": 3}}))
    assert "FABRIC_PROGRAM" not in render_launcher(pinned)
