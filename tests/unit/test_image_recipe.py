"""The recipe and its lock, the build args (every FROM pinned), the content fingerprint, facts against a
lock, the failing-stage reader, the Dockerfile's shape, and `image build` refusing a stale lock (exit 2)."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.plan.image_identity import chain_ids, facts_problems, fingerprint
from sparkserve.plan.image_recipe import (
    BaseLock,
    Lock,
    PatchLock,
    build_args,
    image_tag,
    lock_digest,
    lock_problems,
    parse_lock,
    parse_recipe,
)

REPO = Path(__file__).resolve().parents[2]
RECIPE = """name: sparkserve-vllm-sm121
lane: overlay
base: {image: "vllm/vllm-openai:v0.33.0"}
vllm: {version: 0.33.0, ref: v0.33.0}
series: patches/vllm/series
"""
DIGEST = "vllm/vllm-openai@sha256:" + "ab" * 32


def _lock(**kw) -> Lock:
    base = dict(recipe="sparkserve-vllm-sm121", lane="overlay",
                base=BaseLock(image="vllm/vllm-openai:v0.33.0", digest_ref=DIGEST),
                vllm={"version": "0.33.0", "commit": "g4ba787ec9"},
                patches=[PatchLock(name="0001-a.patch", sha256="11" * 32,
                                   touches={"vllm/a.py": {"before": "22" * 32, "after": "33" * 32}})])
    base.update(kw)
    return Lock(**base)


def test_recipe_errors_name_the_field() -> None:
    with pytest.raises(BadInput) as e:
        parse_recipe(RECIPE.replace("lane: overlay", "lane: sideways"), "r.yaml")
    assert e.value.line().startswith("error: r.yaml: lane: ")
    with pytest.raises(BadInput, match="not an exact 'package==version' pin: torch>=2"):
        parse_recipe(RECIPE + "extra_pip: ['torch>=2']\n", "r.yaml")
    with pytest.raises(BadInput, match="source"):
        parse_recipe(RECIPE.replace("lane: overlay", "lane: source"), "r.yaml")
    with pytest.raises(BadInput, match="base.image"):
        parse_recipe(RECIPE.replace('{image: "vllm/vllm-openai:v0.33.0"}', "{platform: x}"), "r.yaml")


def test_lock_problems_name_each_disagreement() -> None:
    recipe = parse_recipe(RECIPE, "r.yaml")
    series = [("0001-a.patch", b"patch bytes")]
    problems = lock_problems(recipe, _lock(), series)
    assert problems == ["0001-a.patch changed since it was locked (sha256 "
                        f"{__import__('hashlib').sha256(b'patch bytes').hexdigest()[:12]}, lock 111111111111)"]
    assert any("series is (empty)" in p for p in lock_problems(recipe, _lock(), []))
    assert any("base.image" in p for p in lock_problems(
        recipe, _lock(base=BaseLock(image="other:1", digest_ref=DIGEST)), series))
    unresolved = lock_problems(recipe, _lock(base=BaseLock(image="vllm/vllm-openai:v0.33.0")), series)
    assert any("not resolved to a digest" in p for p in unresolved)
    bad_digest = lock_problems(recipe, _lock(base=BaseLock(image="vllm/vllm-openai:v0.33.0", digest_ref="x:1")), [])
    assert any("repo@sha256" in p for p in bad_digest)


def test_every_from_gets_a_digest_pinned_reference_and_the_tag_is_the_lock() -> None:
    recipe = parse_recipe(RECIPE, "r.yaml")
    lock = _lock()
    args = build_args(recipe, lock)
    for arg in re.findall(r"^FROM \$\{(\w+)\}", (REPO / "docker/Dockerfile").read_text(), re.M):
        assert args[arg] == DIGEST, arg
    assert args["LOCK_SHA256"] == lock_digest(lock)
    assert args["SERIES_DIGESTS"] == "0001-a.patch=1111111111111111"
    assert image_tag(recipe, lock) == f"sparkserve-vllm-sm121:{lock_digest(lock)[:12]}"
    assert lock_digest(_lock(vllm={"version": "0.33.0", "commit": "other"})) != lock_digest(lock)


def test_dockerfile_lanes_and_pins() -> None:
    text = (REPO / "docker/Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)(?: AS (\S+))?", text, re.M)
    stages = {alias for _, alias in froms}
    assert {"overlay", "source-deps", "vllm-src", "vllm-wheel", "flashinfer-wheel", "wheel-export", "source"} <= stages
    for image, alias in froms:  # every FROM is an ARG (set from the lock), a stage, or scratch
        assert image.startswith("${") or image in stages or image == "scratch", (image, alias)
    assert re.search(r"^ARG BASE_IMAGE$", text, re.M)  # no default: a build outside the lock fails at FROM
    assert "TORCH_CUDA_ARCH_LIST=12.1a" in text and "type=cache,target=/cache/ccache" in text
    assert "git apply" not in text and "patch -p" not in text  # the applier does it, strictly


def test_shipped_locks_agree_with_their_recipes_but_the_base_is_unresolved() -> None:
    from sparkserve.deploy.image_build import load_recipe_files

    for recipe in (REPO / "docker/recipe.yaml", REPO / "docker/recipes/canada-quant-dflash2e.yaml"):
        files = load_recipe_files(recipe)
        assert files.lock is not None
        assert lock_problems(files.recipe, files.lock, files.series, files.checks) == [
            f"the base {files.recipe.base.image} is not resolved to a digest yet"]
        assert files.lock.vllm == {"version": "0.33.0", "commit": "g4ba787ec9"}


def test_image_build_refuses_the_unresolved_lock_before_touching_a_node(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes: [{name: a, host: 192.0.2.1, fabric_ip: 192.0.2.1}]\n")  # unreachable if touched
    for extra in ([], ["--local", "--lane", "source"]):  # the second: the workflow's source-arm64 step
        res = subprocess.run([str(REPO / ".venv/bin/sparkserve"), "image", "build", "-c", str(cfg), *extra],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2
        assert res.stderr.startswith("error: ")
        assert "recipe.lock.json: the lock disagrees with recipe.yaml" in res.stderr
        assert "Traceback" not in res.stderr


ATTRS = {"Id": "sha256:" + "1" * 64, "Os": "linux", "Architecture": "arm64", "Variant": "v8",
         "RootFS": {"Type": "layers", "Layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64]},
         "Config": {"Env": ["PATH=/usr/bin"], "Cmd": ["python3"], "Labels": {"x": "1"}, "Hostname": "",
                    "Image": "sha256:" + "9" * 64, "Volumes": None, "OnBuild": []},
         "RepoTags": ["a:1"], "Created": "2026-01-01"}


def test_fingerprint_ignores_store_and_build_details_but_not_content() -> None:
    fp = fingerprint(ATTRS)
    containerd = copy.deepcopy(ATTRS)  # the containerd store: another ID, other tags, empty fields absent
    containerd.update(Id="sha256:" + "2" * 64, RepoTags=["b:2"], Created="2027-01-01")
    containerd["Config"] = {"Env": ["PATH=/usr/bin"], "Cmd": ["python3"], "Labels": {"x": "1"}}
    assert fingerprint(containerd) == fp
    changed = copy.deepcopy(ATTRS)
    changed["RootFS"]["Layers"][1] = "sha256:" + "c" * 64
    assert fingerprint(changed) != fp
    env = copy.deepcopy(ATTRS)
    env["Config"]["Env"] = ["PATH=/bin"]
    assert fingerprint(env) != fp
    assert fingerprint({**ATTRS, "Architecture": "amd64"}) != fp


def test_chain_ids_follow_dockers_definition() -> None:
    import hashlib

    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    assert chain_ids([a, b]) == [a, "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()]
    assert chain_ids([b, a])[1] != chain_ids([a, b])[1]  # the same layer on another parent is another layer


def _facts(differing=(), after="33" * 32, version="0.33.0") -> dict:
    return {"vllm": {"version": version, "commit": "g4ba787ec9"}, "record": {"differing": list(differing)},
            "dflash2": {"DFlash2DraftModel": {"module": "qwen3_dflash2", "class": "X", "defined": True}},
            "applied": {"patches": [{"name": "0001-a.patch", "status": "applied",
                                     "touches": {"vllm/a.py": {"after": after}}}]}}


def test_facts_must_match_the_lock() -> None:
    lock = _lock().model_dump(mode="json")
    assert facts_problems(_facts(["vllm/a.py"]), lock) == []
    assert any("no patch touches: vllm/b.py" in p for p in facts_problems(_facts(["vllm/a.py", "vllm/b.py"]), lock))
    assert any("still match the wheel: vllm/a.py" in p for p in facts_problems(_facts([]), lock))
    assert any("vllm/a.py is 444444444444" in p for p in facts_problems(_facts(["vllm/a.py"], "44" * 32), lock))
    assert any("version is '0.32.0'" in p for p in facts_problems(_facts(["vllm/a.py"], version="0.32.0"), lock))
    no_dflash = {**_facts(["vllm/a.py"]), "dflash2": {}}
    assert "vLLM's registry has no DFlash2DraftModel" in facts_problems(no_dflash, lock)


def test_failing_step_names_the_stage_and_its_last_lines() -> None:
    from sparkserve.deploy.image_build import failing_step

    log = "\n".join([
        "#5 [overlay 1/2] FROM docker.io/x@sha256:abc", "#5 DONE 0.0s",
        "#6 [overlay 2/2] RUN --mount=type=bind,source=.,target=/ctx python3 /ctx/tools/apply_series.py",
        "#6 0.101 ==> patch 0001-a.patch: checking",
        "#6 0.130 apply_series: error: 0001-a.patch: hunk #1 of vllm/a.py (@@ -1,3 +1,4 @@) does not apply",
        "#6 ERROR: executor failed running [/bin/sh -c python3 ...]: exit code: 1",
        "failed to solve with frontend dockerfile.v0: failed to build LLB: executor failed running"])
    stage, tail = failing_step(log)
    assert stage.startswith("[overlay 2/2] RUN --mount")
    assert any("hunk #1 of vllm/a.py" in line for line in tail)


def test_parse_lock_rejects_unknown_fields() -> None:
    with pytest.raises(BadInput, match="surprise: Extra inputs are not permitted"):
        parse_lock('{"recipe": "r", "lane": "overlay", "base": {"image": "x"}, "vllm": {}, "surprise": 1}', "l.json")


class _FakeImages:
    def __init__(self, attrs: dict | None) -> None:
        self.attrs = attrs

    def get(self, ref: str):  # type: ignore[no-untyped-def]
        import docker.errors

        if self.attrs is None:
            raise docker.errors.ImageNotFound(ref)
        return type("Img", (), {"id": self.attrs["Id"], "attrs": self.attrs})()


class _FakeNode:
    name = "n1"

    def __init__(self, attrs: dict | None) -> None:
        self._client = type("C", (), {"images": _FakeImages(attrs)})()

    def docker(self):  # type: ignore[no-untyped-def]
        return self._client


def test_identity_gate_value_is_the_fingerprint_where_docker_has_the_image() -> None:
    """What the `identity` gate and rank parity compare (deploy/gates_live.py, deploy/parity.py)."""
    from types import SimpleNamespace

    from sparkserve.nodes.images import identity_of

    assert identity_of(_FakeNode(ATTRS), ATTRS["Id"]) == fingerprint(ATTRS)
    containerd = {**ATTRS, "Id": "sha256:" + "2" * 64}
    assert identity_of(_FakeNode(containerd), containerd["Id"]) == identity_of(_FakeNode(ATTRS), ATTRS["Id"])
    assert identity_of(_FakeNode(None), "sha256:" + "3" * 64) == "sha256:" + "3" * 64  # not a docker image
    assert identity_of(SimpleNamespace(name="p"), "vllm-engine-digest") == "vllm-engine-digest"


class _RunNode:
    """A node whose commands answer from a table (argv[0] → (exit code, stdout))."""

    name = "head"

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.answers = answers

    def run(self, argv, *, timeout=60.0, step="run", check=True, stdin=None):  # type: ignore[no-untyped-def]
        from sparkserve.nodes.base import CommandResult

        code, out = self.answers.get(" ".join(argv), self.answers.get(argv[0], (127, "")))
        return CommandResult(list(argv), code, out, "")


def test_a_foreign_platform_without_a_qemu_handler_fails_loudly() -> None:
    from sparkserve.deploy.image_build import _check_platform
    from sparkserve.nodes.base import NodeError

    no_handler = _RunNode({"uname": (0, "x86_64\n"), "cat": (1, "")})
    with pytest.raises(NodeError) as e:
        _check_platform(no_handler, "linux/arm64")  # type: ignore[arg-type]
    assert "--platform linux/arm64 on a x86_64 node needs qemu user emulation" in e.value.what
    assert "/proc/sys/fs/binfmt_misc/qemu-aarch64 is not registered" in e.value.what
    _check_platform(_RunNode({"uname": (0, "x86_64\n"), "cat": (0, "enabled\n")}), "linux/arm64")  # type: ignore[arg-type]
    _check_platform(_RunNode({"uname": (0, "aarch64\n")}), "linux/arm64")  # type: ignore[arg-type]  # native


def test_builder_is_buildx_else_an_old_cli_with_buildkit_else_a_clear_refusal() -> None:
    from sparkserve.deploy.image_build import builder_argv
    from sparkserve.nodes.base import NodeError

    assert builder_argv(_RunNode({"docker buildx version": (0, "v0.19")})) == ["docker", "buildx", "build", "--load"]  # type: ignore[arg-type]
    old = _RunNode({"docker buildx version": (1, ""), "docker version --format {{.Client.Version}}": (0, "28.2.2"),
                    "/usr/bin/docker version --format {{.Client.Version}}": (0, "20.10.24+dfsg1")})
    assert builder_argv(old) == ["env", "DOCKER_BUILDKIT=1", "/usr/bin/docker", "build"]  # type: ignore[arg-type]
    new_only = _RunNode({"docker buildx version": (1, ""), "docker version --format {{.Client.Version}}": (0, "28.2.2"),
                         "/usr/bin/docker version --format {{.Client.Version}}": (0, "28.2.2")})
    with pytest.raises(NodeError, match="install the docker-buildx plugin"):
        builder_argv(new_only)  # type: ignore[arg-type]
