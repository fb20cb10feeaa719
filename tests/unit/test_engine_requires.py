"""vLLM's declared dependencies checked before any boot (sparkserve/image/requires.py, docker/tools/image_facts.py
``requires``): the evaluator on the real vLLM 0.34.0 wheel's ``Requires-Dist`` lines, with ``packaging`` and
with the fallback; the parser and its headline; and one real process — an environment whose ``vllm``
dist-info requires a distribution that is absent, asked through the process runtime's node program.

Real lines: ``unzip -p vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl vllm-0.34.0.dist-info/METADATA``, lines
27, 32, 36, 37, 50, 53, 63, 64, 85, 90, 97, 98, 99, 100, 102, 104, 117 of that file (verbatim below). The wheel
that real vLLM 0.34.0 on an H100 booted without ``nvidia-cutlass-dsl`` and died at kernel warm-up
(tests/fixtures/logs/real-0.34.0-gpu). What ``nvidia-cutlass-dsl``'s own ``[cu13]`` extra declares is not known
here: the one-level extras case uses a made-up line of that shape.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from image_fixtures import TOOLS, tool  # noqa: E402

from sparkserve.errors import BadInput  # noqa: E402
from sparkserve.image.identity import facts_problems  # noqa: E402
from sparkserve.image.requires import (  # noqa: E402
    engine_requires,
    parse_output,
    parse_requires,
    read_requires_process,
    remember_requires,
    stored_requires,
)
from sparkserve.nodes.base import NodeError  # noqa: E402
from sparkserve.nodes.local import LocalNode  # noqa: E402

facts_tool = tool("image_facts")

REAL_034 = [  # vllm-0.34.0.dist-info/METADATA, verbatim
    "requests>=2.33.0",
    "transformers<5.23.0,>=5.16.1",
    'protobuf!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*,>=5.29.6; '
    'platform_machine != "s390x"',
    'protobuf==7.36.1; platform_machine == "s390x"',
    'llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "arm64" or platform_machine == '
    '"aarch64" or platform_machine == "ppc64le" or platform_machine == "s390x"',
    'xgrammar==0.2.8; platform_machine == "x86_64" or platform_machine == "aarch64" or platform_machine == "arm64" '
    'or platform_machine == "s390x" or platform_machine == "ppc64le"',
    'six>=1.16.0; python_version > "3.11"',
    'setuptools<81.0.0,>=78.1.1; python_version > "3.11"',
    "torch==2.14.0",
    "flashinfer-python==0.7.3",
    "nvidia-cutlass-dsl[cu13]==4.8.0",
    "quack-kernels==0.6.5",
    'tokenspeed-mla==2.0.3; platform_system == "Linux"',
    "humming-kernels[cu13]==0.1.19",
    'zentorch==2.14.0.2; extra == "zen"',
    'pandas; extra == "bench"',
    'runai-model-streamer[azure,gcs,s3]>=0.17.1; extra == "runai"',
]
#: the card's GB10 (aarch64, Python 3.12) as PEP 508 sees it
GB10 = {"implementation_name": "cpython", "implementation_version": "3.12.3", "os_name": "posix",
        "platform_machine": "aarch64", "platform_release": "6.11.0-1016-nvidia", "platform_system": "Linux",
        "platform_version": "#16-Ubuntu", "python_full_version": "3.12.3", "platform_python_implementation": "CPython",
        "python_version": "3.12", "sys_platform": "linux"}
#: everything but the CuTe DSL pair installed; a fork's FlashInfer and a protobuf vLLM excludes
INSTALLED = {"requests": "2.33.1", "transformers": "5.22.2", "protobuf": "6.32.1", "llguidance": "1.7.3",
             "xgrammar": "0.2.8", "six": "1.17.0", "setuptools": "80.9.0", "torch": "2.14.0+cu130",
             "flashinfer-python": "0.6.18.dev20260101", "tokenspeed-mla": "2.0.3", "humming-kernels": "0.1.19"}


@pytest.fixture(params=["packaging", "fallback"])
def how(request, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    """Each evaluator test runs with packaging and with the fallback (packaging made unimportable)."""
    if request.param == "fallback":
        for mod in ("packaging", "packaging.requirements", "packaging.markers", "packaging.specifiers",
                    "packaging.version"):
            monkeypatch.setitem(sys.modules, mod, None)
    return str(request.param)


def test_real_034_lines_without_the_cute_dsl_pair(how: str) -> None:
    got = facts_tool.check_requirements(REAL_034, INSTALLED, GB10)
    assert [m["name"] for m in got["missing"]] == ["nvidia-cutlass-dsl", "quack-kernels"]
    assert got["missing"][0]["requirement"] == "nvidia-cutlass-dsl[cu13]==4.8.0"
    # a fork's FlashInfer and a protobuf inside an excluded series: warnings; torch's +cu130 is inside ==2.14.0
    assert {m["name"]: m["installed"] for m in got["mismatched"]} == {"flashinfer-python": "0.6.18.dev20260101",
                                                                      "protobuf": "6.32.1"}
    assert got["unknown"] == []
    # the s390x protobuf and the three extras (zen, bench, runai) are left out; everything else is checked
    assert (got["checked"], got["skipped"]) == (13, 4)


def test_markers_follow_the_environment(how: str) -> None:
    py311 = {**GB10, "python_version": "3.11", "python_full_version": "3.11.7", "platform_machine": "s390x"}
    got = facts_tool.check_requirements(REAL_034, {}, py311)
    names = [m["name"] for m in got["missing"]]
    assert "six" not in names and "setuptools" not in names  # python_version > "3.11" does not hold on 3.11
    assert names.count("protobuf") == 1 and "llguidance" in names  # s390x: its own protobuf pin, llguidance too
    assert next(m for m in got["missing"] if m["name"] == "protobuf")["requirement"] == "protobuf==7.36.1"
    assert facts_tool.marker_applies('python_version > "3.11"', GB10) is True
    assert facts_tool.marker_applies('python_version >= "3.9" and (sys_platform == "win32" or os_name == "posix")',
                                     GB10) is True
    assert facts_tool.marker_applies('extra == "bench"', GB10) is False
    assert facts_tool.marker_applies('extra == "bench"', GB10, "bench") is True


def test_a_requirement_with_extras_checks_what_the_extra_adds_one_level_down(how: str) -> None:
    cutlass = ["nvidia-cutlass-dsl-libs-base==4.8.0", 'nvidia-cutlass-dsl-libs-cu13==4.8.0; extra == "cu13"',
               'nvidia-cutlass-dsl-libs-cu12==4.8.0; extra == "cu12"']
    installed = {**INSTALLED, "nvidia-cutlass-dsl": "4.8.0", "quack-kernels": "0.6.5"}
    got = facts_tool.check_requirements(REAL_034, installed, GB10, {"nvidia-cutlass-dsl": cutlass})
    # the extra's own line is checked; its base requirement and another extra's are not (not followed further)
    assert got["missing"] == [{"name": "nvidia-cutlass-dsl-libs-cu13", "requirement": "nvidia-cutlass-dsl-libs-cu13"
                               "==4.8.0", "via": "nvidia-cutlass-dsl[cu13]"}]
    check = parse_requires({"vllm": "0.34.0", **got})
    assert check is not None
    assert check.missing_line().startswith("vllm 0.34.0 requires nvidia-cutlass-dsl-libs-cu13 (for "
                                           "nvidia-cutlass-dsl[cu13]): not installed in the image")


def test_names_are_normalised_and_unreadable_lines_are_unknown(how: str) -> None:
    got = facts_tool.check_requirements(["Typing_Extensions>=4.10", "not a requirement ((("],
                                        {"typing-extensions": "4.15.0"}, GB10)
    assert got["missing"] == [] and got["checked"] == 1
    assert [u["requirement"] for u in got["unknown"]] == ["not a requirement ((("]


def test_the_headline_names_the_missing_and_what_the_engine_would_do() -> None:
    raw = {"vllm": "0.34.0", **facts_tool.check_requirements(REAL_034, INSTALLED, GB10)}
    check = parse_requires(raw)
    assert check is not None and not check.ok
    assert check.missing_line() == (
        "vllm 0.34.0 requires nvidia-cutlass-dsl, quack-kernels: not installed in the image — the boot would die "
        "at import (vLLM 0.34.0 imports cutlass (the CuTe DSL) at kernel warm-up, after the whole load)")
    assert check.mismatch_line() == ("vllm 0.34.0: installed outside its pins (a fork's own set is normal): "
                                     "protobuf 6.32.1 (!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,"
                                     "!=6.33.3.*,!=6.33.4.*,>=5.29.6), flashinfer-python 0.6.18.dev20260101 (==0.7.3)")
    # the image facts' problems carry the hard finding only
    assert facts_problems({"vllm": {"version": "0.34.0"}, "requires": raw}, None) == [check.missing_line()]
    assert facts_problems({"vllm": {"version": "0.34.0"}, "requires": {**raw, "missing": []}}, None) == []


def test_the_parser_takes_only_what_it_can_read() -> None:
    assert parse_requires(None) is None and parse_requires({"other": 1}) is None and parse_output("no json") is None
    none = parse_requires({"vllm": None, "error": None, "missing": []})
    assert none is not None and none.ok and none.missing_line() is None  # no vllm distribution: nothing to say
    odd = parse_requires({"vllm": "0.34.0", "missing": [{"name": "quack-kernels"}, 3, {"x": 1}], "checked": "9"})
    assert odd is not None and [r.name for r in odd.missing] == ["quack-kernels"] and odd.checked == 0


def test_docker_answers_are_kept_by_image_id_and_not_asked_again() -> None:
    raw = {"vllm": "0.34.0", **facts_tool.check_requirements(REAL_034, INSTALLED, GB10)}
    remember_requires("sha256:aaa", raw)
    assert stored_requires("sha256:bbb") is None
    kept = stored_requires("sha256:aaa")
    assert kept is not None and [r.name for r in kept.missing] == ["nvidia-cutlass-dsl", "quack-kernels"]
    cfg = SimpleNamespace(runtime="docker", head=SimpleNamespace(name="a"), image=SimpleNamespace(ref="x"))
    found, was_kept = engine_requires(cfg, {"a": None}, "sha256:aaa")  # type: ignore[arg-type]  # no node asked
    assert was_kept and found == kept


# --------------------------------------------------------------------------- one real environment


def _site(tmp_path: Path) -> Path:
    """A site dir with vLLM's dist-info (two real 0.34.0 lines and one that is there) and the one present dist."""
    site = tmp_path / "site"
    meta = site / "vllm-0.34.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 0.34.0\n"
                                   "Requires-Dist: regex\nRequires-Dist: nvidia-cutlass-dsl[cu13]==4.8.0\n"
                                   "Requires-Dist: quack-kernels==0.6.5\nRequires-Dist: pandas; extra == \"bench\"\n")
    (site / "regex-2026.1.15.dist-info").mkdir()
    (site / "regex-2026.1.15.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: regex\n"
                                                                  "Version: 2026.1.15\n")
    return site


SYSTEM_PYTHON = "/usr/bin/python3"  # no packaging, no vllm on this machine: the fallback, in a real process


@pytest.fixture
def system_python() -> str:
    """Debian's interpreter (no ``packaging``): missing, these tests fail — they never skip."""
    assert os.access(SYSTEM_PYTHON, os.X_OK), f"{SYSTEM_PYTHON} is missing: the fallback check needs a real Python"
    return SYSTEM_PYTHON


def test_the_program_names_the_missing_distribution_in_a_real_environment(tmp_path: Path, system_python: str) -> None:
    site = _site(tmp_path)
    res = subprocess.run([system_python, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
                          f"sys.argv = ['x', '--requires']; exec(open({str(TOOLS / 'image_facts.py')!r}).read())"],
                         capture_output=True, text=True, timeout=60)
    check = parse_output(res.stdout)
    assert res.returncode == 0 and check is not None, res.stderr
    assert check.vllm == "0.34.0" and [r.name for r in check.missing] == ["nvidia-cutlass-dsl", "quack-kernels"]
    assert check.checked == 3


def test_the_process_runtime_asks_the_interpreter_serve_vllm_runs(tmp_path: Path, system_python: str) -> None:
    """serve.vllm is a console script whose #! names the interpreter; serve.env's PYTHONPATH is its site. The
    node program (process_remote's ``python`` verb) runs the check there, and `up`'s pre-flight refuses."""
    from sparkserve.deploy.preflight import check_requires

    site = _site(tmp_path)
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!{system_python}\nimport sys\nsys.exit(0)\n")
    exe.chmod(0o755)
    node = LocalNode("local")
    cfg = SimpleNamespace(runtime="process", head=SimpleNamespace(name="local"),
                          serve=SimpleNamespace(vllm=str(exe), env={"PYTHONPATH": str(site), "API_KEY": "x"}))
    check = read_requires_process(node, cfg)  # type: ignore[arg-type]
    assert check is not None and [r.name for r in check.missing] == ["nvidia-cutlass-dsl", "quack-kernels"]
    assert check.how is not None and check.how.startswith("fallback")
    with pytest.raises(BadInput) as e:
        check_requires(cfg, {"local": node}, "sha256:x", lambda _s: None)  # type: ignore[arg-type]
    assert e.value.exit_code == 2 and e.value.line().startswith(
        "error: serve.vllm: vllm 0.34.0 requires nvidia-cutlass-dsl, quack-kernels: not installed where serve.vllm "
        "runs — the boot would die at import")
    # a shell launcher: which python it ends in is not known — said by the reader, silent in `up`
    exe.write_text("#!/bin/sh\nexec python3 -m vllm \"$@\"\n")
    with pytest.raises(NodeError, match="not a Python console script"):
        read_requires_process(node, cfg)  # type: ignore[arg-type]
    said: list[str] = []
    check_requires(cfg, {"local": node}, "sha256:x", said.append)  # type: ignore[arg-type]
    assert said == []
