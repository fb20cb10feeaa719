"""`image build` holds both lanes to their lock: a lock that disagrees with the recipe is refused (exit 2,
before any node is touched) unless `--relock` is given, and `--relock` on the rig's head writes the lane's
own lock — for the source lane: the CUDA images pinned (by ID: stand-ins that were never pushed), vLLM's
commit, torch/FlashInfer indexes / arch list / pins recorded, the real format-patch digested against the vLLM
0.33.0 tree of the stand-in base."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from image_fixtures import REPO, format_patch  # noqa: E402
from vllm_standin import STANDIN_REF, ensure_standin, vllm_wheel  # noqa: E402

pytestmark = pytest.mark.rig

SPARKSERVE = str(REPO / ".venv" / "bin" / "sparkserve")
REL = "vllm/config/speculative.py"
OLD_LINE = "    target_layer_ids = _get_nested_config_value(\n"
COMMIT = "4ba787ec9" + "0" * 31  # vllm.ref given as a 40-hex commit: nothing to resolve offline
DEVEL, RUNTIME = "sparkserve-rigtest/cuda-devel:13.0", "sparkserve-rigtest/cuda-runtime:13.0"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARKSERVE, *args], capture_output=True, text=True, timeout=600, env=dict(os.environ))


@pytest.fixture(scope="module")
def source_recipe(rig, rig_docker, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A source-lane recipe whose CUDA images are local stand-ins on the head (tags of the rig's base)."""
    import zipfile

    head = rig_docker[rig.head.name]
    ensure_standin(head)
    base = head.images.get("sparkserve-rig/base:bookworm")
    for ref in (DEVEL, RUNTIME):
        base.tag(*ref.split(":"))
    with zipfile.ZipFile(vllm_wheel("x86_64")) as z:
        old = z.read(REL).decode()
    where = tmp_path_factory.mktemp("source-recipe")
    patch = format_patch(tmp_path_factory.mktemp("fp"), REL, old, old.replace(OLD_LINE, "    # relock\n" + OLD_LINE),
                         upstream="none (sparkserve rig test)")
    (where / "patches").mkdir()
    (where / "patches" / "0001-rig-test.patch").write_bytes(patch)
    (where / "patches" / "series").write_text("0001-rig-test.patch\n")
    shutil.copy(REPO / "docker/patches/vllm/upstream-checks.json", where / "checks.json")
    (where / "recipe.yaml").write_text(
        f"name: sparkserve-rigtest/vllm-src\nlane: source\nbase: {{image: '{STANDIN_REF}', platform: linux/amd64}}\n"
        f"vllm: {{version: 0.33.0, ref: '{COMMIT}'}}\nseries: patches/series\nupstream_checks: checks.json\n"
        f"source: {{cuda_devel_image: '{DEVEL}', cuda_runtime_image: '{RUNTIME}'}}\n")
    yield where / "recipe.yaml"
    for ref in (DEVEL, RUNTIME):
        head.images.remove(ref)


def _unreachable(tmp_path: Path) -> Path:
    cfg = tmp_path / "unreachable.yaml"
    cfg.write_text("nodes: [{name: a, host: 192.0.2.1, fabric_ip: 192.0.2.1}]\n")  # a refusal never touches it
    return cfg


def test_source_lane_refuses_without_a_lock_and_relocks_on_the_head(rig, source_recipe: Path,
                                                                    tmp_path: Path) -> None:
    from sparkserve.image.context import load_recipe_files
    from sparkserve.image.relock import require_lock

    res = cli("image", "build", "-c", str(_unreachable(tmp_path)), "--recipe", str(source_recipe))
    assert res.returncode == 2 and "no lock for this recipe yet" in res.stderr, res.stderr

    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(source_recipe), "--relock", "--lock-only",
              "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["lane"] == "source"
    lock = json.loads(source_recipe.with_name("recipe.lock.json").read_text())
    assert lock["lane"] == "source" and lock["vllm"] == {"version": "0.33.0", "commit": COMMIT}
    src = lock["source"]
    assert src["cuda_devel"] == DEVEL and src["cuda_devel_image"] == DEVEL  # never pushed: pinned by its ID
    assert src["cuda_devel_id"].startswith("sha256:") and src["cuda_runtime_id"].startswith("sha256:")
    assert src["flashinfer"] == "the vLLM wheel's own pin (its METADATA)"
    assert src["torch_cuda_arch_list"] == "12.0 12.1a"
    assert src["torch_index"] == "https://download.pytorch.org/whl/cu130"
    (patch,) = lock["patches"]
    assert patch["name"] == "0001-rig-test.patch" and list(patch["touches"]) == [REL]
    assert patch["touches"][REL]["before"] != patch["touches"][REL]["after"]
    assert require_lock(load_recipe_files(source_recipe)).lane == "source"  # the build would now go ahead

    stale = source_recipe.read_text().replace(f"'{RUNTIME}'}}", f"'{RUNTIME}', torch_index: 'https://x.invalid/cu131'}}")
    source_recipe.write_text(stale)
    try:
        res = cli("image", "build", "-c", str(_unreachable(tmp_path)), "--recipe", str(source_recipe))
        assert res.returncode == 2, res.stderr
        first = res.stderr.splitlines()[0]
        assert first.startswith("error: ") and "the lock disagrees with recipe.yaml: source torch_index is " \
            "'https://x.invalid/cu131', the lock's is 'https://download.pytorch.org/whl/cu130'; re-lock" in first
        assert "Traceback" not in res.stderr
        res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(source_recipe), "--lock-only")
        assert res.returncode == 0, res.stderr[-3000:]
        assert require_lock(load_recipe_files(source_recipe)).source["torch_index"] == "https://x.invalid/cu131"
    finally:
        source_recipe.write_text(stale.replace(", torch_index: 'https://x.invalid/cu131'", ""))


def test_overlay_lane_refuses_a_changed_patch_until_relocked(rig, source_recipe: Path, tmp_path: Path) -> None:
    """The same recipe built as the overlay lane (--lane overlay): its lock is another lane's, so refused;
    relocked for overlay; then a patch edit is refused again, naming the patch."""
    from sparkserve.image.context import load_recipe_files
    from sparkserve.image.relock import require_lock

    copy = tmp_path / "overlay"
    shutil.copytree(source_recipe.parent, copy)
    recipe = copy / "recipe.yaml"
    res = cli("image", "build", "-c", str(_unreachable(tmp_path)), "--recipe", str(recipe), "--lane", "overlay")
    assert res.returncode == 2 and "lane is 'overlay', the lock's is 'source'" in res.stderr, res.stderr
    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(recipe), "--lane", "overlay",
              "--lock-only")
    assert res.returncode == 0, res.stderr[-3000:]
    lock = require_lock(load_recipe_files(recipe), "overlay")
    assert lock.lane == "overlay" and lock.base.id and lock.vllm["commit"] == "g4ba787ec9"
    patch = copy / "patches" / "0001-rig-test.patch"
    patch.write_text(patch.read_text().replace("# relock", "# relock, edited"))
    res = cli("image", "build", "-c", str(_unreachable(tmp_path)), "--recipe", str(recipe), "--lane", "overlay")
    assert res.returncode == 2
    assert "0001-rig-test.patch changed since it was locked" in res.stderr.splitlines()[0], res.stderr
