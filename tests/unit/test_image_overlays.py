"""The card's lane in docker/tools/apply_series.py on real vLLM 0.33.0 files: whole-file overlays checked
before and after the copy, the known-dirty rule (the overlays' paths and nothing else), the card's markers and
registry gate, --verify-only for a prebuilt image, the SM12x known-defect checks ("still broken" / "fixed"),
and the facts of the result held to a lock."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from image_fixtures import REPO, TOOLS, VENV_SITE  # noqa: E402

from sparkserve.image.identity import facts_problems  # noqa: E402

KV = "vllm/v1/core/kv_cache_utils.py"
KPOOL = "vllm/model_executor/layers/sparse_attn_indexer_kpool.py"
FORK_KPOOL = '"""A stand-in for the fork\'s kpool module (the wheel has none)."""\n\n\ndef kpool() -> None:\n    pass\n'
REAL = (KV, "vllm/_version.py", "vllm/platforms/cuda.py",
        "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py")
MARKERS = [{"file": KV, "contains": "DFLASH2-DRAFTER-GROUP"}, {"file": KPOOL, "contains": "topk_indices_buffer"}]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A fork-like site-packages: real 0.33.0 files, a kpool module the fork has, RECORD matching both."""
    assert VENV_SITE is not None, "scripts/setup installs vllm==0.33.0 into .venv"
    s = tmp_path / "site"
    for rel in REAL:
        (s / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(VENV_SITE / rel, s / rel)
    for tree in ("vllm/model_executor/models", "vllm/models"):  # the registry and every class it names
        shutil.copytree(VENV_SITE / tree, s / tree, ignore=shutil.ignore_patterns("__pycache__"))
    (s / KPOOL).parent.mkdir(parents=True, exist_ok=True)
    (s / KPOOL).write_text(FORK_KPOOL)
    info = s / "vllm-0.33.0.dist-info"
    info.mkdir()
    shutil.copy(VENV_SITE / "vllm-0.33.0.dist-info" / "RECORD", info / "RECORD")
    with open(info / "RECORD", "a") as f:
        f.write(f"{KPOOL},sha256={_b64(FORK_KPOOL.encode())},{len(FORK_KPOOL)}\n")
    return s


def _overlays(ctx: Path, site: Path, *, registry: tuple[str, ...] = ("Glm5NextForConditionalGeneration",),
              markers: list | None = None) -> tuple[Path, dict[str, bytes]]:
    """overlays.json + overlays/<path>: the real kv_cache_utils.py with the drafter-group marker, a kpool with
    the top-k buffer (stand-ins for the card's files, which are not copied here)."""
    data = {KV: (site / KV).read_bytes() + b"\n# DFLASH2-DRAFTER-GROUP: stand-in marker (sparkserve test)\n",
            KPOOL: FORK_KPOOL.encode() + b"\ntopk_indices_buffer = None  # the top-k fix stand-in\n"}
    for rel, b in data.items():
        (ctx / "overlays" / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / "overlays" / rel).write_bytes(b)
    plan = {"overlays": [{"path": rel, "sha256": _sha(b)} for rel, b in data.items()],
            "markers": MARKERS if markers is None else markers, "registry": list(registry)}
    (ctx / "overlays.json").write_text(json.dumps(plan))
    return ctx / "overlays.json", data


def _run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOLS / "apply_series.py"), "--root", str(site), *args],
                          capture_output=True, text=True)


def _facts(site: Path, lock: dict) -> dict:
    (site.parent / "lock.json").write_text(json.dumps(lock))
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import image_facts as f; f.IMAGE_LOCK = sys.argv[3];"
            " print(json.dumps(f.facts(f.Path(sys.argv[2]), archs=False, applied=sys.argv[4])))")
    res = subprocess.run([sys.executable, "-c", code, str(TOOLS), str(site), str(site.parent / "lock.json"),
                          str(site.parent / "applied.json")], capture_output=True, text=True, check=True)
    return dict(json.loads(res.stdout))


def test_overlays_are_copied_checked_compiled_and_the_gate_holds(tmp_path: Path, site: Path) -> None:
    plan, data = _overlays(tmp_path, site)
    res = _run(site, "--overlays", str(plan), "--manifest", str(tmp_path / "applied.json"))
    assert res.returncode == 0, res.stderr
    for rel, b in data.items():
        assert (site / rel).read_bytes() == b
        assert f"==> overlay {rel}: copied, sha256 {_sha(b)[:16]} before and after" in res.stdout
    assert "==> markers: 'DFLASH2-DRAFTER-GROUP', 'topk_indices_buffer' present" in res.stdout
    assert "==> registry: Glm5NextForConditionalGeneration registered" in res.stdout
    assert list((site / "vllm/v1/core/__pycache__").glob("kv_cache_utils.*.pyc"))  # compiled
    manifest = json.loads((tmp_path / "applied.json").read_text())
    assert [(o["path"], o["status"], o["after"]) for o in manifest["overlays"]] == [
        (rel, "copied", _sha(b)) for rel, b in data.items()]
    lock = {"vllm": {"version": "0.33.0", "commit": "g4ba787ec9"}, "patches": [],
            "overlays": {rel: _sha(b) for rel, b in data.items()},
            "checks": {"markers": MARKERS, "registry": ["Glm5NextForConditionalGeneration"]}}
    facts = _facts(site, lock)
    assert sorted(facts["record"]["differing"]) == sorted(data)  # exactly the known-dirty set
    assert facts["overlays"] == lock["overlays"]
    assert facts["registry"]["Glm5NextForConditionalGeneration"]["defined"] is True
    assert facts_problems(facts, lock) == []
    assert any("overlay vllm/v1/core/kv_cache_utils.py is" in p
               for p in facts_problems(facts, {**lock, "overlays": {**lock["overlays"], KV: "ab" * 32}}))
    (site / "vllm/_version.py").write_text((site / "vllm/_version.py").read_text() + "\n# touched\n")
    assert "files differ from the wheel's RECORD that no patch or overlay touches: vllm/_version.py" in \
        facts_problems(_facts(site, lock), lock)


def test_one_wrong_byte_in_an_overlay_is_refused_before_copying_and_named(tmp_path: Path, site: Path) -> None:
    plan, data = _overlays(tmp_path, site)
    before = (site / KPOOL).read_bytes()
    bad = tmp_path / "overlays" / KPOOL
    b = bytearray(bad.read_bytes())
    b[10] ^= 1
    bad.write_bytes(bytes(b))
    res = _run(site, "--overlays", str(plan))
    assert res.returncode == 1
    assert f"apply_series: error: overlay {KPOOL}: the file to copy is sha256 {_sha(bytes(b))[:12]} but the " \
           f"recipe says {_sha(data[KPOOL])[:12]} (refused before copying)" in res.stderr
    assert (site / KPOOL).read_bytes() == before and (site / KV).read_bytes() != data[KV]  # KV went back too


def test_only_the_overlays_may_differ_from_record(tmp_path: Path, site: Path) -> None:
    plan, data = _overlays(tmp_path, site)
    (site / KV).write_bytes(data[KV])  # a base that already carries an overlay (the card's own image)
    assert _run(site, "--overlays", str(plan)).returncode == 0
    (site / "vllm/platforms/cuda.py").write_text((site / "vllm/platforms/cuda.py").read_text() + "# edited\n")
    res = _run(site, "--overlays", str(plan))
    assert res.returncode == 1
    assert "the tree is not pristine: vllm/platforms/cuda.py (only the overlays may differ from RECORD: " \
           f"{KPOOL}, {KV})" in res.stderr


def test_the_cards_gate_refuses_a_missing_marker_or_architecture(tmp_path: Path, site: Path) -> None:
    plan, _ = _overlays(tmp_path, site, markers=[*MARKERS, {"file": KV, "contains": "NOT-THERE", "why": "test"}])
    before = (site / KV).read_bytes()
    res = _run(site, "--overlays", str(plan))
    assert res.returncode == 1 and f"marker: {KV} lacks 'NOT-THERE' (test)" in res.stderr
    assert (site / KV).read_bytes() == before  # nothing half-done
    plan, _ = _overlays(tmp_path, site, registry=("Glm5NextForConditionalGeneration", "NoSuchForCausalLM"))
    res = _run(site, "--overlays", str(plan))
    assert res.returncode == 1 and "registry: NoSuchForCausalLM is not in vLLM's ModelRegistry" in res.stderr


def test_verify_only_holds_a_prebuilt_tree_to_the_same_facts(tmp_path: Path, site: Path) -> None:
    plan, data = _overlays(tmp_path, site)
    res = _run(site, "--overlays", str(plan), "--verify-only")  # the base: the overlays are not there
    assert res.returncode == 1
    assert f"overlay {KV}: the image's file is {_sha((VENV_SITE / KV).read_bytes())[:12]} but the recipe says " \
           f"{_sha(data[KV])[:12]}" in res.stderr
    assert _run(site, "--overlays", str(plan)).returncode == 0  # as the card's build leaves it
    res = _run(site, "--overlays", str(plan), "--verify-only")
    assert res.returncode == 0, res.stderr
    assert f"==> overlay {KV}: present" in res.stdout and "registry: Glm5NextForConditionalGeneration" in res.stdout


def test_sm12x_known_defects_read_still_broken_on_0_33_0_and_fixed_once_gone(tmp_path: Path, site: Path) -> None:
    checks = tmp_path / "checks.json"
    facts = [f for f in json.loads((REPO / "docker/patches/vllm/upstream-checks.json").read_text())
             if f.get("expect") == "broken"]
    assert len(facts) == 4 and all(f["why"].startswith("SM12x: ") for f in facts)
    checks.write_text(json.dumps(facts))
    manifest = tmp_path / "m.json"
    res = _run(site, "--checks", str(checks), "--manifest", str(manifest))
    assert res.returncode == 0, res.stderr
    assert "0 upstream checks hold, 4 known upstream defects still there, 0 fixed" in res.stdout
    cuda = site / "vllm/platforms/cuda.py"
    cuda.write_text(cuda.read_text().replace("        return major >= 9", "        return major in (9, 10)"))
    res = _run(site, "--checks", str(checks), "--manifest", str(manifest))
    assert res.returncode == 1 and "not pristine: vllm/platforms/cuda.py" in res.stderr  # an edited tree...
    record = next(site.glob("vllm-*.dist-info/RECORD"))  # ...so make it a "new upstream" that fixed PDL
    record.write_text("\n".join(f"vllm/platforms/cuda.py,sha256={_b64(cuda.read_bytes())},1"
                                if ln.startswith("vllm/platforms/cuda.py,") else ln
                                for ln in record.read_text().splitlines()) + "\n")
    res = _run(site, "--checks", str(checks), "--manifest", str(manifest))
    assert res.returncode == 0, res.stderr
    assert "==> upstream check: FIXED? vllm/platforms/cuda.py no longer contains" in res.stdout
    assert "3 known upstream defects still there, 1 fixed" in res.stdout
    statuses = [f["status"] for f in json.loads(manifest.read_text())["upstream_checks"]]
    assert statuses == ["still-broken", "still-broken", "fixed", "still-broken"]
    (site / "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py").unlink()
    res = _run(site, "--checks", str(checks), "--manifest", str(manifest))
    assert [f["status"] for f in json.loads(manifest.read_text())["upstream_checks"]] == [
        "still-broken", "not-in-tree", "fixed", "not-in-tree"]
