"""The arm64 base build cleans up after a killed debootstrap: a proc left mounted in its target is detached
before the tree is removed (CI once failed every later run of test_arm64_overlay_build_under_qemu on that)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))

import vllm_standin as standin  # noqa: E402

pytestmark = pytest.mark.rig


def test_a_target_with_live_mounts_is_detached_then_removed(tmp_path: Path) -> None:
    target = tmp_path / "basefs-arm64.tmp"
    (target / "proc").mkdir(parents=True)
    (target / "dev" / "pts").mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "proc", "proc", str(target / "proc")], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"the rig runs as root and can mount proc: {r.stderr.strip()}", pytrace=False)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target / "dev")], check=True)
    (target / "dev" / "pts").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target / "dev" / "pts")], check=True)
    try:
        assert standin._mounts_under(target) == [str(target / "dev" / "pts"), str(target / "proc"),
                                                 str(target / "dev")]
        standin._clear(target)
        assert standin._mounts_under(target) == []
        assert not target.exists()
        assert Path("/proc/self/status").is_file()  # the host's /proc untouched
    finally:
        for m in standin._mounts_under(target):
            subprocess.run(["umount", "-l", m])


def test_a_sibling_path_with_the_same_prefix_is_not_touched(tmp_path: Path) -> None:
    target, sibling = tmp_path / "t", tmp_path / "t2"
    (target / "x").mkdir(parents=True)
    sibling.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(sibling)], check=True)
    try:
        assert standin._mounts_under(target) == []
        standin._clear(target)
        assert standin._mounts_under(sibling) == [str(sibling)]
    finally:
        subprocess.run(["umount", "-l", str(sibling)])
