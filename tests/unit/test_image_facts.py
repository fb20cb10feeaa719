"""docker/tools/image_facts.py: the CUDA arch census from .nv_fatbin (generated fixtures and the real vLLM
0.33.0 wheels), the RECORD check, version/commit and the DFlash2 registry classes — read, never imported."""

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
from image_fixtures import NEW_A, NEW_ABI, OLD_A, PLAIN, TOOLS, VENV_SITE, ZSTD, elf_with_fatbin, tool  # noqa: E402

facts_tool = tool("image_facts")


def _census(tmp_path: Path, entries) -> dict:
    (tmp_path / "vllm").mkdir(exist_ok=True)
    (tmp_path / "vllm" / "_k.abi3.so").write_bytes(elf_with_fatbin(entries))
    return facts_tool.arch_census(tmp_path)["libraries"]["vllm/_k.abi3.so"]


def test_sm121a_cubin_is_native_and_marked_built_for_121a(tmp_path: Path) -> None:
    lib = _census(tmp_path, [(2, 121, PLAIN | NEW_ABI | NEW_A, b"\x7fELF cubin")])
    assert lib["codes"] == {"sm_121a": 1}
    assert lib["sm121"] == "native" and lib["built_for_sm121a"] is True


def test_sm120a_cubin_does_not_run_on_sm121(tmp_path: Path) -> None:
    lib = _census(tmp_path, [(2, 120, PLAIN | NEW_ABI | NEW_A | ZSTD, b"(\xb5/\xfd")])
    assert lib["codes"] == {"sm_120a": 1}
    assert lib["sm121"] == "none"


def test_family_ptx_is_read_from_its_target_and_jits_on_sm121(tmp_path: Path) -> None:
    lib = _census(tmp_path, [(1, 120, PLAIN | NEW_ABI, b"//\n.version 9.0\n.target sm_120f\n.address_size 64\n")])
    assert lib["codes"] == {"compute_120f": 1}
    assert lib["sm121"] == "ptx-jit"


def test_family_or_plain_sm120_cubin_runs_on_sm121_but_an_sm90a_one_does_not(tmp_path: Path) -> None:
    lib = _census(tmp_path, [(2, 120, PLAIN | NEW_ABI | ZSTD, b"(\xb5/\xfd"), (2, 90, PLAIN | OLD_A, b"\x7fELF")])
    assert lib["codes"] == {"sm_120": 1, "sm_90a": 1}
    assert lib["sm121"] == "native"
    only_90a = _census(tmp_path, [(2, 90, PLAIN | OLD_A, b"\x7fELF")])
    assert only_90a["sm121"] == "none"


def test_ptx_only_library_is_jit_not_native(tmp_path: Path) -> None:
    lib = _census(tmp_path, [(1, 80, PLAIN, b".version 8.0\n.target sm_80\n")])
    assert lib == {"codes": {"compute_80": 1}, "sm121": "ptx-jit", "built_for_sm121a": False}


def test_runs_on_rules() -> None:
    r = facts_tool.runs_on
    assert r("sm_121a") and r("sm_120") and r("sm_120f") and r("compute_90") and r("compute_120f")
    assert not r("sm_120a") and not r("sm_100") and not r("sm_122") and not r("compute_90a")


@pytest.fixture(scope="module")
def arm_tree() -> Path:
    from vllm_standin import unpacked

    return unpacked("aarch64", "so")


def test_stock_aarch64_wheel_120_field_is_sm120_and_sm120a_no_sm121a(arm_tree: Path) -> None:
    """What the stock aarch64 0.33.0 wheel really holds: its "120" cubins are arch-specific sm_120a (which
    does not run on SM121) next to portable sm_120 ones; nothing is built for 12.1a; FlashMLA, FA3 and other
    Hopper/Blackwell-datacenter kernels have no code for SM121 at all."""
    census = facts_tool.arch_census(arm_tree)
    libs = census["libraries"]
    c = libs["vllm/_C_stable_libtorch.abi3.so"]["codes"]
    assert c.get("sm_120", 0) > 0 and c.get("sm_120a", 0) > 0 and "sm_121a" not in c and "sm_121" not in c
    assert libs["vllm/_C_stable_libtorch.abi3.so"]["sm121"] == "native"
    assert libs["vllm/_flashmla_C.abi3.so"]["codes"].keys() == {"sm_90a", "sm_100a"}
    assert "vllm/_flashmla_C.abi3.so" in census["without_sm121_code"]
    assert census["built_for_sm121a"] == [] and census["all_run_on_sm121"] is False


def test_x86_64_wheel_in_the_venv_has_the_same_split() -> None:
    assert VENV_SITE is not None, "scripts/setup installs vllm==0.33.0 into .venv"
    libs = facts_tool.arch_census(VENV_SITE)["libraries"]
    c = libs["vllm/_C_stable_libtorch.abi3.so"]["codes"]
    assert c["sm_90a"] > 0 and c["sm_120a"] > 0 and c["sm_120"] > 0 and "sm_121a" not in c


def _tree(tmp_path: Path) -> Path:
    """A small site-packages: vllm/_version.py, a registry with two DFlash archs, a RECORD over both."""
    site = tmp_path / "site"
    files = {
        "vllm/_version.py": "__version__ = version = '0.33.0'\n__commit_id__ = commit_id = 'g4ba787ec9'\n",
        "vllm/model_executor/models/registry.py":
            '_M = {\n    "DFlash2DraftModel": ("qwen3_dflash2", "DFlash2Qwen3ForCausalLM"),\n'
            '    "DFlashGhost": ("vllm.models.ghost", "Ghost"),\n}\n',
        "vllm/model_executor/models/qwen3_dflash2.py": "class DFlash2Qwen3ForCausalLM:\n    pass\n",
    }
    rows = []
    for rel, text in files.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        h = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={h},{len(text)}")
    rows.append('"vllm/with,comma.json",sha256=' + "A" * 43 + ",3")
    rows.append("vllm-0.33.0.dist-info/RECORD,,")
    (site / "vllm-0.33.0.dist-info").mkdir()
    (site / "vllm-0.33.0.dist-info" / "RECORD").write_text("\n".join(rows) + "\n")
    (site / "vllm-0.33.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.33.0\n")
    return site


def test_record_diff_lists_exactly_the_edited_file_and_the_missing_one(tmp_path: Path) -> None:
    site = _tree(tmp_path)
    assert facts_tool.record_diff(site)["differing"] == []
    (site / "vllm/model_executor/models/qwen3_dflash2.py").write_text("class DFlash2Qwen3ForCausalLM:\n    x = 1\n")
    diff = facts_tool.record_diff(site)
    assert diff["differing"] == ["vllm/model_executor/models/qwen3_dflash2.py"]
    assert diff["missing"] == ["vllm/with,comma.json"]  # a quoted CSV path in RECORD


def test_version_and_dflash2_classes_resolve_by_ast(tmp_path: Path) -> None:
    site = _tree(tmp_path)
    assert facts_tool.vllm_version(site) == {"version": "0.33.0", "commit": "g4ba787ec9", "metadata_version": "0.33.0"}
    got = facts_tool.dflash2_classes(site)
    assert got["DFlash2DraftModel"]["defined"] is True
    assert got["DFlashGhost"] == {"module": "vllm.models.ghost", "class": "Ghost", "defined": False}


def test_the_program_prints_json_with_a_python_that_has_no_vllm_or_torch(tmp_path: Path) -> None:
    site = _tree(tmp_path)
    py = shutil.which("python3") or sys.executable
    res = subprocess.run([py, "-I", str(TOOLS / "image_facts.py"), "--site", str(site)], capture_output=True,
                         text=True, check=True)
    facts = json.loads(res.stdout)
    assert facts["vllm"]["version"] == "0.33.0" and facts["record"]["checked"] == 3
    assert facts["archs"]["libraries"] == {} and facts["applied"] is None


def test_an_image_without_vllm_reports_it_instead_of_failing(tmp_path: Path) -> None:
    from sparkserve.image.identity import facts_problems

    facts = facts_tool.facts(None)
    assert facts["vllm"]["version"] is None and facts["record"] is None
    assert facts_problems(facts, None)[0] == "no vLLM in the image (vllm/_version.py not found)"


def test_package_versions_torch_cuda_and_the_gpu_mark_are_read_from_files(tmp_path: Path) -> None:
    """What a lock records beside vLLM (issue 23): FlashInfer's three wheels, torch and its CUDA, Triton — from
    dist-info METADATA and torch/version.py; the GPU smoke mark from /opt/sparkserve/gpu-smoke.json."""
    site = tmp_path / "site"
    for dist, name, version in (("flashinfer_python-0.7.2.post1", "flashinfer-python", "0.7.2.post1"),
                                ("flashinfer_jit_cache-0.7.2.post1+cu130", "flashinfer-jit-cache", "0.7.2.post1+cu130"),
                                ("torch-2.14.0+cu130", "torch", "2.14.0+cu130"), ("numpy-2.0.0", "numpy", "2.0.0")):
        (site / f"{dist}.dist-info").mkdir(parents=True)
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        (site / f"{dist}.dist-info" / "METADATA").write_text(meta)
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.14.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    assert facts_tool.packages(site) == {"flashinfer-python": "0.7.2.post1", "flashinfer-cubin": None,
                                         "flashinfer-jit-cache": "0.7.2.post1+cu130", "torch": "2.14.0+cu130",
                                         "triton": None, "torch_cuda": "13.0"}
    mark = tmp_path / "gpu-smoke.json"
    mark.write_text('{"verified": false, "why": "built without running the GPU smoke stage on a GPU"}\n')
    facts_tool.GPU_SMOKE = str(mark)
    try:
        assert facts_tool.facts(None)["gpu_smoke"] == {"verified": False, "why": "built without running the GPU "
                                                       "smoke stage on a GPU"}
    finally:
        facts_tool.GPU_SMOKE = "/opt/sparkserve/gpu-smoke.json"
