"""init · render · plan · drafter inspect, as a user runs them (real process, exit codes, output)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from _fixtures import REPO, clean_env, cli, config_file, write_drafter, write_target

from sparkserve.config import default_yaml_text, load_config
from sparkserve.plan.build import build_plan


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("m")
    return write_drafter(root / "drafter"), write_target(root / "target")


def test_init_writes_the_commented_default_and_refuses_to_overwrite(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    p = cli("init", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "sparkserve.yaml").read_text() == default_yaml_text()
    p = cli("init", env=env, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip() == "error: sparkserve.yaml: exists (use --force to overwrite)"
    assert cli("init", "--force", env=env, cwd=tmp_path).returncode == 0


def test_render_prints_copy_pasteable_docker_runs_equal_to_the_plan(tmp_path: Path) -> None:
    p = cli("render", env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    blocks = [b for b in p.stdout.split("\n\n") if b.strip()]
    assert [b.splitlines()[0] for b in blocks] == [
        "# spark-a (spark-a.lan): rank 0, head; starts 2 of 2",
        "# spark-b (spark-b.lan): rank 1, follower; starts 1 of 2"]
    plan = build_plan(load_config(REPO / "sparkserve" / "data" / "default.yaml"))
    for block, spec in zip(blocks, plan.specs, strict=True):
        shell = "\n".join(block.splitlines()[1:])
        # the bind mounts' missing sources first (docker refuses them), then the run: both paste as they are
        assert spec.make_dirs and all(d.startswith("/home/") for d in spec.make_dirs)
        assert shlex.split(shell.replace("\\\n", " ")) == ["mkdir", "-p", "--", *spec.make_dirs,
                                                          *spec.docker_run_argv()]


def test_render_json_for_one_node_and_an_unknown_node(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    p = cli("render", "--node", "spark-b", "--json", env=env)
    assert p.returncode == 0, p.stderr
    spec = json.loads(p.stdout)
    assert spec["node"] == "spark-b" and spec["role"] == "follower" and "--headless" in spec["command"]
    assert spec["docker_run"][:2] == ["docker", "run"]
    p = cli("render", "--node", "spark-z", env=env)
    assert p.returncode == 2
    assert p.stderr.strip() == "error: --node: 'spark-z' is not in the config (nodes: spark-a, spark-b)"


def test_render_and_plan_show_a_configured_api_key_redacted_and_never_read_it(tmp_path: Path) -> None:
    cfg = config_file(tmp_path / "c.yaml", {"serve": {"api_key_env": "MY_API_KEY"}})
    env = clean_env(tmp_path, MY_API_KEY="sk-live-123")
    for args in (["render"], ["render", "--json"], ["plan", "--json"]):
        p = cli(*args, "-c", str(cfg), env=env)
        assert p.returncode == 0, p.stderr
        assert "sk-live-123" not in p.stdout
    data = json.loads(p.stdout)
    assert data["plan"]["specs"][0]["env"]["VLLM_API_KEY"] == "<redacted>"
    assert "VLLM_API_KEY" not in data["plan"]["specs"][1]["env"]
    assert "-e VLLM_API_KEY \\" in cli("render", "-c", str(cfg), env=env).stdout


def test_render_refuses_a_config_preflight_rejects(tmp_path: Path) -> None:
    cfg = config_file(tmp_path / "c.yaml", {"serve": {"tensor_parallel_size": 8}})
    p = cli("render", "-c", str(cfg), env=clean_env(tmp_path))
    assert p.returncode == 2 and p.stderr.startswith("error: serve.tensor_parallel_size: 8 but")


def test_render_launcher_equals_the_committed_script(tmp_path: Path) -> None:
    out = tmp_path / "l.sh"
    p = cli("render", "--launcher", "-o", str(out), env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert out.read_text() == (REPO / "launch_dflash2_tp2.sh").read_text()


def test_plan_lists_the_steps_in_order(tmp_path: Path) -> None:
    p = cli("plan", "--json", env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert [s["step"] for s in data["steps"]] == [
        "validate", "preflight", "image", "drafter", "memory", "start", "start", "wait", "gates"]
    assert [s.get("node") for s in data["steps"] if s["step"] == "start"] == ["spark-b", "spark-a"]
    assert data["plan"]["start_order"] == ["spark-b", "spark-a"]
    ray = config_file(tmp_path / "r.yaml", {"serve": {"executor": "ray"}})
    data = json.loads(cli("plan", "--json", "-c", str(ray), env=clean_env(tmp_path)).stdout)
    assert [s.get("node") for s in data["steps"] if s["step"] in ("start", "serve")] == \
        ["spark-a", "spark-b", "spark-a"]
    human = cli("plan", env=clean_env(tmp_path)).stdout
    assert human.splitlines()[0].startswith("sparkserve plan (config ")
    assert " 6. start     vllm serve --headless in sparkserve-r1-spark-b on spark-b.lan" in human


def test_drafter_inspect_json_for_the_fixture(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    drafter, target = dirs
    p = cli("drafter", "inspect", str(drafter), "--target", str(target), "--json", env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    d = data["drafter"]
    assert (d["architecture"], d["block_size"], d["expected_k"], d["mask_token_id"], d["taps"]) == \
        ("DFlash2DraftModel", 8, 7, 154856, 3)
    assert (d["weights"]["selector_tensors"], d["weights"]["conv_tensors"], d["fc_input_width"]) == (3, 8, 768)
    assert d["mask"] == {"present": True, "form": "dict", "mask_token_id": 154856, "embedding_shape": [256],
                         "embedding_dtype": "bfloat16", "error": None}
    m = data["manifest"]
    assert set(m["files"]) == {"config.json", "model.safetensors", "mask_embedding.pt"} and len(m["digest"]) == 64
    assert data["target"]["num_hidden_layers"] == 4 and data["target"]["kv_bytes_per_token_per_rank"] == 512
    assert data["checks"] == {"errors": [], "warnings": []}


def test_drafter_inspect_table_for_people(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    p = cli("drafter", "inspect", str(dirs[0]), env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    for needle in ("DFlash2DraftModel (dflash2; dflash format)", "8 → K = 7 (config K = 7)",
                   "154856 (dflash_config.mask_token_id)", "[0, 1, 2] (3 taps; vLLM aux layers [1, 2, 3])",
                   "selector tensors  │ 3", "conv tensors      │ 8", "768 (= 3 x 256)",
                   "dict form, mask_token_id 154856, bfloat16 [256]", "sha256 manifest ",
                   "checks: ok against the embedded default config (K=7, mask 154856)"):
        assert needle in p.stdout, needle


def test_drafter_inspect_shows_problems_but_a_missing_dir_is_exit_2(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    d = write_drafter(tmp_path / "d")
    (d / "mask_embedding.pt").unlink()
    p = cli("drafter", "inspect", str(d), "--no-hash", env=env)
    assert p.returncode == 0 and "problem: drafter.path: " in p.stdout and "has no mask_embedding.pt" in p.stdout
    p = cli("drafter", "inspect", str(tmp_path / "nope"), env=env)
    assert p.returncode == 2 and p.stderr.strip() == f"error: drafter.path: {tmp_path / 'nope'} does not exist"


def test_image_ship_from_an_unknown_node_is_bad_input_before_any_node_is_touched(tmp_path: Path) -> None:
    # these hosts do not resolve here: had a node been opened, this would be exit 3 (init's placeholder hosts
    # would be refused as placeholders: exit 2 for another reason)
    nodes = [{"name": "spark-a", "host": "spark-a.invalid", "fabric_ip": "192.168.200.1"},
             {"name": "spark-b", "host": "spark-b.invalid", "fabric_ip": "192.168.200.2"}]
    p = cli("image", "ship", "--from", "nope", "-c", str(config_file(tmp_path / "c.yaml", {"nodes": nodes})),
            env=clean_env(tmp_path))
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == ["error: --from: no node named 'nope' (nodes: spark-a, spark-b)"]
