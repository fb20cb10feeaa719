"""`sparkserve image build | ship | verify` for real on the rig: a stand-in base (the rig's Debian base + the
real vllm 0.33.0 wheel) on node-a, a recipe with a real format-patch, the overlay lane built over SSH with
BuildKit, smoke-tested, shipped node to node (only missing layers), verified by fingerprint and facts.

One build per module (``built``); every other test reuses it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import contextlib

from image_fixtures import REPO, format_patch  # noqa: E402
from vllm_standin import STANDIN_REF, ensure_standin, vllm_wheel  # noqa: E402

pytestmark = pytest.mark.rig

SPARKSERVE = str(REPO / ".venv" / "bin" / "sparkserve")
REL = "vllm/config/speculative.py"
OLD_LINE = "    target_layer_ids = _get_nested_config_value(\n"
NEW_LINE = "    # sparkserve rig test patch\n" + OLD_LINE


def cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARKSERVE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _wheel_file(rel: str) -> str:
    import zipfile

    with zipfile.ZipFile(vllm_wheel("x86_64")) as z:
        return z.read(rel).decode()


def make_recipe(where: Path, name: str, patch: bytes) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "patches").mkdir(exist_ok=True)
    (where / "patches" / "0001-rig-test.patch").write_bytes(patch)
    (where / "patches" / "series").write_text("0001-rig-test.patch\n")
    shutil.copy(REPO / "docker/patches/vllm/upstream-checks.json", where / "checks.json")
    (where / "recipe.yaml").write_text(
        f"name: {name}\nlane: overlay\nbase: {{image: '{STANDIN_REF}', platform: linux/amd64}}\n"
        "vllm: {version: 0.33.0, ref: v0.33.0}\nseries: patches/series\nupstream_checks: checks.json\n")
    return where / "recipe.yaml"


@pytest.fixture(scope="module")
def standin(rig, rig_docker) -> str:  # type: ignore[no-untyped-def]
    return ensure_standin(rig_docker["node-a"])


@pytest.fixture(scope="module")
def recipe_dir(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    old = _wheel_file(REL)
    patch = format_patch(tmp_path_factory.mktemp("fp"), REL, old, old.replace(OLD_LINE, NEW_LINE),
                         upstream="none (sparkserve rig test)")
    return make_recipe(tmp_path_factory.mktemp("recipe"), "sparkserve-rigtest/vllm", patch).parent


@pytest.fixture(scope="module")
def built(rig, rig_docker, standin, recipe_dir) -> Iterator[dict]:  # type: ignore[no-untyped-def]
    """The overlay image, built once on the head (node-a) over SSH: `image build --relock` (BuildKit)."""
    import rig as riglib

    with riglib.exclusive_use():
        res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(recipe_dir / "recipe.yaml"),
                  "--relock", "--no-smoke-import", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    yield out
    for client in rig_docker.values():
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(out["tag"], force=True)


def _cfg_for(rig, tmp_path: Path, ref: str) -> Path:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(Path(rig.rig_yaml).read_text())
    data["image"]["ref"] = ref
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_overlay_build_over_ssh_applies_the_real_series_and_the_facts_prove_it(built, rig_docker,
                                                                               recipe_dir) -> None:
    lock = json.loads((recipe_dir / "recipe.lock.json").read_text())
    assert built["node"] == "node-a" and built["tag"].startswith("sparkserve-rigtest/vllm:")
    assert built["tag"].endswith(built["lock_sha256"][:12])
    assert built["differing_from_record"] == [REL]  # exactly the series' file
    assert built["vllm"]["version"] == "0.33.0" and built["vllm"]["commit"] == "g4ba787ec9"
    img = rig_docker["node-a"].images.get(built["tag"])
    labels = img.attrs["Config"]["Labels"]
    assert labels["io.sparkserve.lock-sha256"] == built["lock_sha256"]
    assert labels["io.sparkserve.series"] == f"0001-rig-test.patch={lock['patches'][0]['sha256'][:16]}"
    assert lock["base"]["id"] and lock["base"]["digest_ref"] is None  # a never-pushed base: pinned by ID
    log = Path(built["log"]).read_text()
    assert "==> patch 0001-rig-test.patch: applied (vllm/config/speculative.py)" in log
    assert "4 upstream checks hold" in log


def test_ship_sends_only_missing_layers_node_to_node_then_verify_agrees(built, rig, rig_docker,
                                                                       tmp_path: Path) -> None:
    cfg = _cfg_for(rig, tmp_path, built["tag"])
    with contextlib.suppress(docker.errors.ImageNotFound):
        rig_docker["node-b"].images.remove(built["tag"], force=True)
    res = cli("image", "ship", "-c", str(cfg), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    first = json.loads(res.stdout)["shipped"]["node-b"]
    assert first["how"] == "stream" and first["bytes"] > 0
    assert first["skipped_bytes"] > 100e6  # node-b already holds the rig's Debian base layer
    res = cli("image", "verify", "-c", str(cfg), "--json")
    assert res.returncode == 0, res.stdout[-2000:]
    check = json.loads(res.stdout)
    assert check["ok"] and len(set(check["fingerprints"].values())) == 1
    assert check["facts"]["node-b"]["record"]["differing"] == [REL]
    res = cli("image", "ship", "-c", str(cfg), "--json")  # unchanged: nothing moves
    again = json.loads(res.stdout)["shipped"]["node-b"]
    assert again == {"bytes": 0, "skipped_bytes": 0, "how": "already there", "seconds": 0.0, "mb_per_s": 0.0}


def test_verify_fails_when_a_node_has_another_image(built, rig, rig_docker, tmp_path: Path) -> None:
    cfg = _cfg_for(rig, tmp_path, built["tag"])
    b = rig_docker["node-b"]
    with contextlib.suppress(docker.errors.ImageNotFound):
        b.images.remove(built["tag"], force=True)
    repo, tag = built["tag"].rsplit(":", 1)
    b.images.get("sparkserve-rig/base:bookworm").tag(repo, tag)
    try:
        res = cli("image", "verify", "-c", str(cfg), "--no-facts")
        assert res.returncode == 1
        assert "NOT the same image on every node" in res.stdout and "node-b" in res.stdout
    finally:
        b.images.remove(built["tag"])


def test_a_build_that_does_not_import_is_untagged(built, rig, rig_docker, recipe_dir) -> None:
    """The stand-in has no torch: with the smoke import on, `import vllm` fails and the tag is removed."""
    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(recipe_dir / "recipe.yaml"))
    assert res.returncode == 1
    assert "smoke test: `import vllm` fails in" in res.stderr and "No module named 'torch'" in res.stderr
    assert "removed the tag" in res.stderr
    with pytest.raises(docker.errors.ImageNotFound):
        rig_docker["node-a"].images.get(built["tag"])
    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(recipe_dir / "recipe.yaml"),
              "--no-smoke-import", "--json")  # put it back for the other tests (cached: seconds)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_hunk_failing_inside_the_build_names_the_stage_and_the_hunk(built, rig, tmp_path: Path,
                                                                     recipe_dir) -> None:
    copy = tmp_path / "broken"
    shutil.copytree(recipe_dir, copy)
    patch = copy / "patches" / "0001-rig-test.patch"
    head, hunks = patch.read_text().split("\n@@ ", 1)
    ctx = next(line for line in hunks.splitlines()[1:] if line.startswith(" ") and len(line) > 8)
    patch.write_text(head + "\n@@ " + hunks.replace(ctx + "\n", ctx + " # drifted\n", 1))
    lock = json.loads((copy / "recipe.lock.json").read_text())
    import hashlib

    lock["patches"][0]["sha256"] = hashlib.sha256(patch.read_bytes()).hexdigest()  # locked as it is now
    (copy / "recipe.lock.json").write_text(json.dumps(lock))
    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(copy / "recipe.yaml"), "--no-smoke-import")
    assert res.returncode == 3
    first = next(line for line in res.stderr.splitlines() if line.startswith("error: "))
    assert first.startswith("error: node-a: build: [overlay 2/2] RUN --mount=type=bind") and "failed" in first
    assert "hunk #1 of vllm/config/speculative.py" in res.stderr


def test_build_local_with_this_machines_docker_cli(built, rig, recipe_dir) -> None:
    """--local: the same build through this machine's docker CLI (here aimed at node-a's daemon)."""
    env = {"DOCKER_HOST": f"unix://{rig.head.docker_socket}"}
    res = cli("image", "build", "--local", "-c", str(rig.rig_yaml), "--recipe", str(recipe_dir / "recipe.yaml"),
              "--no-smoke-import", "--json", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["tag"] == built["tag"] and out["fingerprint"] == built["fingerprint"]  # BuildKit cache: same image


@pytest.mark.timeout(1500)  # issue 25: a known long rig test — on a clean machine the arm64 base is debootstrapped
def test_arm64_overlay_build_under_qemu(built, rig, rig_docker, tmp_path_factory) -> None:
    """--platform linux/arm64 on the x86 rig: binfmt_misc mounted and qemu-aarch64 registered (a test that
    cannot do that FAILS), an arm64 stand-in (arm64 Debian + the real aarch64 wheel's files), the same real
    patch, built by BuildKit under emulation and smoke-tested by running the arm64 image."""
    from vllm_standin import ARM64_STANDIN_REF, ensure_arm64_standin, ensure_binfmt_aarch64

    try:
        ensure_binfmt_aarch64()
    except RuntimeError as e:
        pytest.fail(f"arm64 under qemu cannot run here: {e}", pytrace=False)
    ensure_arm64_standin(rig.head.docker_url)
    import zipfile

    with zipfile.ZipFile(vllm_wheel("aarch64")) as z:
        old = z.read(REL).decode()
    patch = format_patch(tmp_path_factory.mktemp("fp-arm"), REL, old, old.replace(OLD_LINE, NEW_LINE),
                         upstream="none (sparkserve rig test)")
    recipe = make_recipe(tmp_path_factory.mktemp("recipe-arm"), "sparkserve-rigtest/vllm-arm64", patch)
    text = recipe.read_text().replace(STANDIN_REF, ARM64_STANDIN_REF).replace("linux/amd64", "linux/arm64")
    recipe.write_text(text)
    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(recipe), "--relock", "--no-smoke-import",
              "--platform", "linux/arm64", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    try:
        img = rig_docker["node-a"].images.get(out["tag"])
        assert img.attrs["Architecture"] == "arm64"
        assert out["differing_from_record"] == [REL] and out["vllm"]["commit"] == "g4ba787ec9"
    finally:
        rig_docker["node-a"].images.remove(out["tag"], force=True)
