"""docker/tools/apply_series.py on real vLLM 0.33.0 files: a real format-patch applies with the lock's
digests; a broken hunk, a drifted file, an already-upstream patch, a dirty tree, a wrong Touches: header and a
broken upstream check are each their own refusal; `sparkserve image series-check` on the real wheels."""

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
from image_fixtures import REPO, TOOLS, VENV_SITE, format_patch  # noqa: E402

REL = "vllm/config/speculative.py"
OLD_LINE = "    target_layer_ids = _get_nested_config_value(\n"
NEW_LINE = "    # sparkserve test patch: the DSpark path reads target_layer_ids here\n" + OLD_LINE


def _record_line(site: Path, rel: str) -> str:
    data = (site / rel).read_bytes()
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={h},{len(data)}"


def _rehash_in_record(site: Path, rel: str) -> None:
    """What a new wheel would carry: RECORD matching the file as it is now."""
    record = next(site.glob("vllm-*.dist-info/RECORD"))
    lines = [(_record_line(site, rel) if line.startswith(rel + ",") else line)
             for line in record.read_text().splitlines()]
    record.write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site-packages with the real wheel's speculative.py and eagle3_utils.py and its real RECORD."""
    assert VENV_SITE is not None, "scripts/setup installs vllm==0.33.0 into .venv"
    s = tmp_path / "site"
    for rel in (REL, "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", "vllm/_version.py"):
        (s / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(VENV_SITE / rel, s / rel)
    info = s / "vllm-0.33.0.dist-info"
    info.mkdir()
    shutil.copy(VENV_SITE / "vllm-0.33.0.dist-info" / "RECORD", info / "RECORD")
    return s


def _patch(tmp_path: Path, site: Path, **kw) -> Path:
    old = (site / REL).read_text()
    assert old.count(OLD_LINE) == 1
    data = format_patch(tmp_path, REL, old, old.replace(OLD_LINE, NEW_LINE), **kw)
    series = tmp_path / "series"
    series.mkdir(exist_ok=True)
    (series / "0001-test.patch").write_bytes(data)
    (series / "series").write_text("# test series\n0001-test.patch\n")
    return series / "series"


def _run(site: Path, series: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOLS / "apply_series.py"), "--root", str(site), "--series",
                           str(series), *extra], capture_output=True, text=True)


def _lock(tmp_path: Path, site: Path, series: Path) -> Path:
    """Relock on a copy of the pristine tree (as `image build --relock` does in a throwaway container)."""
    copy = tmp_path / "relock-copy"
    shutil.copytree(site, copy)
    res = _run(copy, series, "--relock")
    assert res.returncode == 0, res.stderr
    lock = tmp_path / "lock.json"
    lock.write_text(res.stdout)
    return lock


def test_a_real_format_patch_applies_with_the_locks_digests(tmp_path: Path, site: Path) -> None:
    series = _patch(tmp_path, site)
    lock = _lock(tmp_path, site, series)
    entry = json.loads(lock.read_text())["patches"][0]
    before = hashlib.sha256((site / REL).read_bytes()).hexdigest()
    assert entry["touches"][REL]["before"] == before != entry["touches"][REL]["after"]
    res = _run(site, series, "--lock", str(lock), "--compile", "--manifest", str(tmp_path / "applied.json"))
    assert res.returncode == 0, res.stderr
    assert "==> patch 0001-test.patch: applied (vllm/config/speculative.py)" in res.stdout
    assert NEW_LINE in (site / REL).read_text()
    assert hashlib.sha256((site / REL).read_bytes()).hexdigest() == entry["touches"][REL]["after"]
    assert list((site / "vllm/config/__pycache__").glob("speculative.*.pyc"))  # byte-compiled: exactly it
    applied = json.loads((tmp_path / "applied.json").read_text())
    assert [p["status"] for p in applied["patches"]] == ["applied"]


def test_a_hunk_that_does_not_apply_is_named(tmp_path: Path, site: Path) -> None:
    series = _patch(tmp_path, site)
    p = series.parent / "0001-test.patch"
    head, hunks = p.read_text().split("\n@@ ", 1)
    ctx = next(line for line in hunks.splitlines()[1:] if line.startswith(" ") and len(line) > 8)
    p.write_text(head + "\n@@ " + hunks.replace(ctx + "\n", ctx + " # drifted context\n", 1))
    res = _run(site, series)
    assert res.returncode == 1
    assert "apply_series: error: 0001-test.patch: hunk #1 of vllm/config/speculative.py (@@ -" in res.stderr
    assert "does not apply" in res.stderr
    assert NEW_LINE not in (site / REL).read_text()


def test_offset_only_drift_that_git_apply_accepts_is_caught_by_the_lock(tmp_path: Path, site: Path) -> None:
    series = _patch(tmp_path, site)
    lock = _lock(tmp_path, site, series)
    text = (site / REL).read_text()
    (site / REL).write_text("# a newer base\n" * 7 + text)  # the hunk still applies "with offset 7"
    _rehash_in_record(site, REL)  # a new wheel: its RECORD agrees with its files, so the tree is pristine
    res = _run(site, series, "--lock", str(lock))
    assert res.returncode == 1
    assert f"0001-test.patch: {REL} drifted: sha256" in res.stderr and "re-lock" in res.stderr
    assert NEW_LINE not in (site / REL).read_text()


def test_a_patch_already_in_the_base_is_refused_unless_marked_merged(tmp_path: Path, site: Path) -> None:
    series = _patch(tmp_path, site)
    (tmp_path / "m").mkdir()
    merged = _patch(tmp_path / "m", site, upstream="vllm-project/vllm#40000 (merged in 1a2b3c4d)")
    text = (site / REL).read_text()
    (site / REL).write_text(text.replace(OLD_LINE, NEW_LINE))  # a newer base that contains the change
    _rehash_in_record(site, REL)
    res = _run(site, series)
    assert res.returncode == 1
    assert "0001-test.patch: already present in the tree" in res.stderr and "merged in" in res.stderr
    res = _run(site, merged)
    assert res.returncode == 0, res.stderr
    assert "already upstream (merged in 1a2b3c4d); skipped" in res.stdout


def test_a_dirty_tree_is_refused_before_any_patch(tmp_path: Path, site: Path) -> None:
    series = _patch(tmp_path, site)
    (site / REL).write_text((site / REL).read_text() + "# local edit\n")
    res = _run(site, series)
    assert res.returncode == 1
    assert f"the tree is not pristine: {REL}" in res.stderr


def test_touches_header_must_name_the_files_the_diff_touches(tmp_path: Path, site: Path) -> None:
    series = _patch(tmp_path, site, touches="vllm/config/model.py")
    res = _run(site, series)
    assert res.returncode == 1
    assert "Touches: says vllm/config/model.py but the diff touches vllm/config/speculative.py" in res.stderr


def test_an_upstream_check_that_no_longer_holds_is_refused(tmp_path: Path, site: Path) -> None:
    checks = json.loads((REPO / "docker/patches/vllm/upstream-checks.json").read_text())[:1]
    path = tmp_path / "checks.json"
    path.write_text(json.dumps(checks))
    (tmp_path / "empty").write_text("")
    assert _run(site, tmp_path / "empty", "--checks", str(path)).returncode == 0
    rel = checks[0]["file"]
    (site / rel).write_text((site / rel).read_text().replace("target_layer_ids", "target_layers"))
    _rehash_in_record(site, rel)
    res = _run(site, tmp_path / "empty", "--checks", str(path))
    assert res.returncode == 1
    assert f"upstream check: {rel} no longer contains" in res.stderr and "eagle3_utils.py:124" in res.stderr


def test_image_ci_series_on_both_real_wheels_with_the_shipped_recipe() -> None:
    """The CI step (scripts/image-ci series): the shipped (empty) series and its upstream checks against the
    x86_64 and aarch64 wheels; the RECORD diff afterwards is exactly the series' files (none)."""
    res = subprocess.run([str(REPO / "scripts" / "image-ci"), "series", "--json"], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr + res.stdout
    out = json.loads(res.stdout)
    names = [w["wheel"] for w in out["wheels"]]
    assert any("x86_64" in n for n in names) and any("aarch64" in n for n in names)
    assert all(w["ok"] and w["differing"] == [] for w in out["wheels"])


def test_series_check_applies_a_real_patch_to_a_real_wheel_and_checks_record(tmp_path: Path, site: Path) -> None:
    from vllm_standin import vllm_wheel

    from sparkserve.image.context import load_recipe_files, write_lock
    from sparkserve.image.series import check_series_on_wheel, lock_from_wheel

    series = _patch(tmp_path, site)
    shutil.copy(REPO / "docker/patches/vllm/upstream-checks.json", tmp_path / "checks.json")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: t/vllm\nbase: {image: 'vllm/vllm-openai:v0.33.0'}\nvllm: {version: 0.33.0, ref: v0.33.0}\n"
                      f"series: {series.relative_to(tmp_path)}\nupstream_checks: checks.json\n")
    files = load_recipe_files(recipe)
    write_lock(files, lock_from_wheel(files, vllm_wheel("x86_64")))
    result = check_series_on_wheel(load_recipe_files(recipe), vllm_wheel("x86_64"))
    assert result.ok, result.summary
    assert result.differing == [REL] == result.expected
