"""The model card's lane for real on the rig (issue 23): a stand-in fork base on node-a (the vLLM 0.33.0
stand-in + a ``sparse_attn_indexer_kpool.py`` its RECORD lists, as the fork's wheel would), a recipe with two
whole-file overlays (local files, sha256-gated) and the card's markers and registry check, built over SSH by
BuildKit; a wrong overlay byte refused before a node is touched and, inside the build, by the applier; the
result used as a ``prebuilt`` image (checked as it is, never built); the GPU smoke stage finding no GPU on
the rig and the image marked "not GPU-verified", which `image verify` shows.

The overlays here are sparkserve's own stand-ins (the real wheel's kv_cache_utils.py + a marker line, a small
kpool module), never the card's files."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from image_fixtures import REPO  # noqa: E402
from vllm_standin import SITE, STANDIN_REF, ensure_standin, vllm_wheel  # noqa: E402

pytestmark = pytest.mark.rig

SPARKSERVE = str(REPO / ".venv" / "bin" / "sparkserve")
FORK_REF = "sparkserve-standin/vllm-fork:sm121-test"
KV = "vllm/v1/core/kv_cache_utils.py"
KPOOL = "vllm/model_executor/layers/sparse_attn_indexer_kpool.py"
FORK_KPOOL = b'"""sparkserve rig stand-in for the fork\'s kpool module."""\n\n\ndef kpool() -> None:\n    pass\n'
CHECKS = {"markers": [{"file": KV, "contains": "DFLASH2-DRAFTER-GROUP"},
                      {"file": KPOOL, "contains": "topk_indices_buffer"}],
          "registry": ["Glm5NextForConditionalGeneration"]}


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARKSERVE, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fork_context() -> bytes:
    """FROM the 0.33.0 stand-in + the kpool module at its site-packages path + a RECORD that lists it."""
    import base64

    with zipfile.ZipFile(vllm_wheel("x86_64")) as z:
        record = z.read("vllm-0.33.0.dist-info/RECORD")
    digest = base64.urlsafe_b64encode(hashlib.sha256(FORK_KPOOL).digest()).rstrip(b"=")
    record += f"{KPOOL},sha256={digest.decode()},{len(FORK_KPOOL)}\n".encode()
    dockerfile = (f"FROM {STANDIN_REF}\nCOPY kpool.py /{SITE}/{KPOOL}\n"
                  f"COPY RECORD /{SITE}/vllm-0.33.0.dist-info/RECORD\n").encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("Dockerfile", dockerfile), ("kpool.py", FORK_KPOOL), ("RECORD", record)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def fork_base(rig, rig_docker) -> str:  # type: ignore[no-untyped-def]
    head = rig_docker["node-a"]
    ensure_standin(head)
    img, _ = head.images.build(fileobj=io.BytesIO(_fork_context()), custom_context=True, tag=FORK_REF, rm=True,
                               network_mode="none")
    return str(img.id)


@pytest.fixture(scope="module")
def recipe_dir(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    where = tmp_path_factory.mktemp("card-recipe")
    with zipfile.ZipFile(vllm_wheel("x86_64")) as z:
        kv = z.read(KV) + b"\n# DFLASH2-DRAFTER-GROUP: sparkserve rig stand-in marker\n"
    kpool = FORK_KPOOL + b"\ntopk_indices_buffer = None  # sparkserve rig stand-in for the top-k fix\n"
    (where / "fork").mkdir()
    (where / "fork" / "kv_cache_utils.py").write_bytes(kv)
    (where / "fork" / "sparse_attn_indexer_kpool.py").write_bytes(kpool)
    recipe = {"name": "sparkserve-rigtest/card", "lane": "overlay",
              "base": {"image": FORK_REF, "platform": "linux/amd64"}, "vllm": {"version": "0.33.0", "ref": "v0.33.0"},
              "overlays": [{"path": KPOOL, "source": "fork/sparse_attn_indexer_kpool.py", "sha256": _sha(kpool)},
                           {"path": KV, "source": "fork/kv_cache_utils.py", "sha256": _sha(kv)}],
              "checks": CHECKS}
    (where / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return where


@pytest.fixture(scope="module")
def built(rig, rig_docker, fork_base, recipe_dir) -> Iterator[dict]:  # type: ignore[no-untyped-def]
    import rig as riglib

    with riglib.exclusive_use():
        res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(recipe_dir / "recipe.yaml"),
                  "--relock", "--no-smoke-import", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    out["stderr"] = res.stderr
    yield out
    for client in rig_docker.values():
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(out["tag"], force=True)


def test_the_card_lane_builds_from_the_fork_base_with_sha_checked_overlays(built, recipe_dir, fork_base,
                                                                          rig_docker) -> None:
    lock = json.loads((recipe_dir / "recipe.lock.json").read_text())
    assert lock["base"] == {"image": FORK_REF, "digest_ref": None, "id": fork_base}  # never pushed: by its ID
    assert lock["vllm"] == {"version": "0.33.0", "commit": "g4ba787ec9"}  # read from the base, not written
    # the stand-in's own facts: Debian's Python, and torch as the metadata stub of vLLM's `torch==2.14.0` pin that
    # the stand-in carries for the dependency check (tests/helpers/vllm_standin.py) — metadata alone, no torch:
    assert lock["facts"]["python"].startswith("3.11") and lock["facts"]["torch"] == "2.14.0"
    assert "No module named 'torch'" in lock["facts"]["dialect"]["error"]  # its parser cannot be built: said so
    assert set(lock["overlays"]) == {KV, KPOOL} and lock["checks"]["registry"] == CHECKS["registry"]
    assert sorted(built["differing_from_record"]) == sorted([KV, KPOOL])  # the known-dirty set, nothing else
    applied = json.loads(rig_docker["node-a"].containers.run(built["tag"], entrypoint=["cat"], remove=True,
                                                             command=["/opt/sparkserve/applied.json"]))
    assert {o["path"]: (o["status"], o["before"], o["after"]) for o in applied["overlays"]} == {
        KPOOL: ("copied", _sha(FORK_KPOOL), lock["overlays"][KPOOL]),
        KV: ("copied", applied["overlays"][1]["before"], lock["overlays"][KV])}
    log = Path(built["log"]).read_text()
    if "==> series:" in log:  # the applier ran in this build (a rerun of the same lock is a BuildKit cache hit)
        for rel, sha in lock["overlays"].items():
            assert f"==> overlay {rel}: copied, sha256 {sha[:16]} before and after" in log
        assert "==> markers: 'DFLASH2-DRAFTER-GROUP', 'topk_indices_buffer' present" in log
        assert "==> registry: Glm5NextForConditionalGeneration registered" in log
    # no GPU on the rig: said loudly, the image stays marked
    assert built["gpu_verified"] is False and built["gpu_smoke"]["ran"] is False
    assert "no GPU on node-a" in built["gpu_smoke"]["why"]
    assert "is NOT GPU-verified" in built["stderr"]


def test_verify_shows_the_not_gpu_verified_mark(built, rig, tmp_path: Path) -> None:
    data = yaml.safe_load(Path(rig.rig_yaml).read_text())
    data["image"]["ref"] = built["tag"]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    res = cli("image", "ship", "-c", str(cfg), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    res = cli("image", "verify", "-c", str(cfg))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "NOT GPU-verified: built without running the GPU smoke stage on a GPU" in res.stdout
    check = json.loads(cli("image", "verify", "-c", str(cfg), "--json").stdout)
    assert check["ok"] and check["gpu_verified"] is False
    assert check["facts"]["node-b"]["gpu_smoke"] == {"verified": False, "why": "built without running the GPU "
                                                     "smoke stage on a GPU"}


def test_a_wrong_overlay_byte_refuses_the_build_and_names_the_file(built, rig, recipe_dir, monkeypatch) -> None:
    from sparkserve.image.build import BuildFailed, build_image
    from sparkserve.image.context import load_recipe_files, overlay_bytes
    from sparkserve.image.relock import require_lock
    from sparkserve.nodes.local import LocalNode

    overlay = recipe_dir / "fork" / "kv_cache_utils.py"
    good = overlay.read_bytes()
    bad = bytearray(good)
    bad[100] ^= 0x20
    overlay.write_bytes(bytes(bad))
    try:  # here, before any node: exit 2 naming the overlay and its file
        res = cli("image", "build", "-c", "/nonexistent.yaml", "--recipe", str(recipe_dir / "recipe.yaml"))
        assert res.returncode == 2, res.stderr
        assert res.stderr.startswith(f"error: {recipe_dir / 'recipe.yaml'}: overlays: {KV}: fork/kv_cache_utils.py "
                                     f"is sha256 {_sha(bytes(bad))[:16]}…, the recipe says {_sha(good)[:16]}…")
    finally:
        overlay.write_bytes(good)
    files = load_recipe_files(recipe_dir / "recipe.yaml")
    wrong = {**overlay_bytes(files), KV: bytes(bad)}  # and inside the build, should bytes slip past that check
    monkeypatch.setenv("DOCKER_HOST", f"unix://{rig.head.docker_socket}")  # this machine's docker CLI, node-a's daemon
    node = LocalNode("node-a", docker_host=f"unix://{rig.head.docker_socket}")
    try:
        with pytest.raises(BuildFailed) as e:
            build_image(node, files, require_lock(files), smoke_import=None, overlays=wrong)
    finally:
        node.close()
    assert e.value.what.startswith("[overlay 2/2] RUN --mount=type=bind") and "failed" in e.value.what
    assert any(f"overlay {KV}: the file to copy is sha256 {_sha(bytes(bad))[:12]} but the recipe says "
               f"{_sha(good)[:12]} (refused before copying)" in line for line in e.value.details)


def test_the_prebuilt_lane_checks_an_image_as_it_is(built, rig, rig_docker, recipe_dir, tmp_path: Path) -> None:
    """The built card image standing in for the card's published one: pinned (by ID: never pushed), checked
    with the same overlays, markers and registry, tagged, its content untouched; the fork base, which lacks
    the overlays, is refused."""
    lock = json.loads((recipe_dir / "recipe.lock.json").read_text())
    recipe = {"name": "sparkserve-rigtest/card-prebuilt", "lane": "prebuilt",
              "base": {"image": built["tag"], "platform": "linux/amd64"}, "vllm": {"version": "0.33.0", "ref": "x"},
              "overlays": [{"path": p, "sha256": s} for p, s in lock["overlays"].items()], "checks": CHECKS}
    path = tmp_path / "prebuilt.yaml"
    path.write_text(yaml.safe_dump(recipe))
    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(path), "--relock", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["fingerprint"] == built["fingerprint"] and out["image_id"] == built["image_id"]  # as it is
    assert out["tag"].startswith("sparkserve-rigtest/card-prebuilt:") and out["gpu_verified"] is False
    plock = json.loads((tmp_path / "prebuilt.lock.json").read_text())
    assert plock["lane"] == "prebuilt" and plock["base"]["id"] == built["image_id"]
    assert plock["vllm"] == {"version": "0.33.0", "commit": "g4ba787ec9"}
    rig_docker["node-a"].images.remove(out["tag"])
    path.write_text(yaml.safe_dump({**recipe, "base": {"image": FORK_REF, "platform": "linux/amd64"}}))
    res = cli("image", "build", "-c", str(rig.rig_yaml), "--recipe", str(path), "--relock")
    assert res.returncode == 3, res.stderr[-2000:]
    first = next(ln for ln in res.stderr.splitlines() if ln.startswith("error: "))
    assert first.startswith("error: node-a: relock: overlay ") and "the image's file is" in first


def test_a_passing_gpu_smoke_is_committed_into_the_image(built, rig, rig_docker) -> None:
    """What the GPU stage does after a pass on a Spark (the rig has no GPU, so the report is the program's
    own shape, given here): one layer with the report, the label, and `image facts` reading it back."""
    from sparkserve.image.gpu_smoke import GpuSmoke, mark_gpu_verified, verification_line
    from sparkserve.image.run import image_facts
    from sparkserve.nodes.local import LocalNode

    client = rig_docker["node-a"]
    ref = "sparkserve-rigtest/card:gpu-mark"
    client.images.get(built["tag"]).tag(*ref.split(":"))
    report = {"capability": "12.1", "passed": ["device", "triton"], "not_covered": [], "checks": []}
    node = LocalNode("node-a", docker_host=f"unix://{rig.head.docker_socket}")
    try:
        new_id = mark_gpu_verified(node, ref, GpuSmoke(True, True, "every check passed", report))
        facts = image_facts(node, ref)
    finally:
        node.close()
        client.images.remove(ref, force=True)
    assert new_id != built["image_id"]
    assert facts["gpu_smoke"]["verified"] is True and facts["gpu_smoke"]["node"] == "node-a"
    assert verification_line(facts).startswith("GPU-verified on node-a at ")
    assert sorted(facts["record"]["differing"]) == sorted([KV, KPOOL])  # the content is otherwise the same
