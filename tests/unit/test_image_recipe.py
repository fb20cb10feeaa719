"""The recipe and its lock, the build args (every FROM pinned), the content fingerprint, facts against a
lock, the failing-stage reader, the Dockerfile's shape, and `image build` refusing a stale lock (exit 2)."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.image.identity import chain_ids, facts_problems, fingerprint
from sparkserve.image.recipe import (
    BaseLock,
    Checks,
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
                                   touches={"vllm/a.py": {"before": "22" * 32, "after": "33" * 32}})],
                facts={"torch": "2.14.0", "flashinfer": "0.7.2.post1", "cuda": "13.0"})
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
    assert {"overlay", "source-deps", "vllm-src", "vllm-wheel", "wheel-export", "source"} <= stages
    for image, alias in froms:  # every FROM is an ARG (set from the lock), a stage, or scratch
        assert image.startswith("${") or image in stages or image == "scratch", (image, alias)
    assert re.search(r"^ARG BASE_IMAGE$", text, re.M)  # no default: a build outside the lock fails at FROM
    assert "type=cache,target=/cache/ccache" in text
    assert "git apply" not in text and "patch -p" not in text  # the applier does it, strictly
    assert "--overlays /ctx/overlays.json" in text.split("AS overlay", 1)[1].split("FROM ", 1)[0]
    assert '"verified": false' in text and 'io.sparkserve.gpu-verified="false"' in text  # marked until smoke


def _stage(text: str, name: str) -> str:
    return text.split(f" AS {name}\n", 1)[1].split("\nFROM ", 1)[0]


def test_source_lane_keeps_the_12_0f_kernels_and_pins_what_vllm_requires() -> None:
    """The source lane's repairs (issue 23 item 3), each where it must be."""
    text = (REPO / "docker/Dockerfile").read_text()
    # every stage that compiles or ships kernels says "12.0 12.1a": 12.0 keeps the 12.0f family kernels
    arch = re.findall(r'^ARG TORCH_CUDA_ARCH_LIST=(.*)$', text, re.M)
    assert arch and set(arch) == {'"12.0 12.1a"'}, arch
    recipe = parse_recipe((REPO / "docker/recipes/upstream-0.33.0.yaml").read_text(), "u.yaml")
    assert recipe.torch_cuda_arch_list.split() == ["12.0", "12.1a"]
    assert parse_recipe(RECIPE, "r.yaml").torch_cuda_arch_list == "12.0 12.1a"  # the default too
    deps, wheel, runner = _stage(text, "source-deps"), _stage(text, "vllm-wheel"), _stage(text, "source")
    assert "sh.rustup.rs" in deps and "cargo --version" in deps and "CARGO_HOME" in deps
    assert 'ARG TORCH_INDEX' in wheel and '--index-url "${TORCH_INDEX}"' in wheel
    assert "wheel_pins.py requirement torch requirements/cuda.txt" in wheel
    assert wheel.index("use_existing_torch.py") < wheel.index("--no-build-isolation")
    assert "wheel_pins.py census /wheels/vllm-*.whl --sm 121 --keep-family 120" in wheel
    assert "wheel_pins.py flashinfer /wheels/vllm-*.whl > /wheels/flashinfer.txt" in wheel
    assert "flashinfer" not in _stage(text, "vllm-src") and "FLASHINFER_REF" not in text  # never built
    assert '-r /wheels/flashinfer.txt' in runner and '--extra-index-url "${FLASHINFER_INDEX}"' in runner
    assert '-r /wheels/torch.txt' in runner and 'test -x "${CUDA_HOME}/bin/nvcc"' in runner
    assert "include/cuda_runtime.h" in runner and "TRITON_PTXAS_PATH" not in text
    assert "--no-archs" not in runner  # the runner's facts carry the census
    src = recipe.source
    assert src is not None and "devel" in src.cuda_runtime_image  # nvcc + headers at run time
    assert src.torch_index.endswith("/whl/cu130")
    args = build_args(recipe.model_copy(update={"lane": "source"}), _lock(
        lane="source", source={"cuda_devel_image": DIGEST, "cuda_runtime_image": DIGEST}))
    assert args["TORCH_CUDA_ARCH_LIST"] == "12.0 12.1a" and args["TORCH_INDEX"] == src.torch_index
    assert args["FLASHINFER_INDEX"] == "https://flashinfer.ai/whl/cu130"


def test_the_flashinfer_pin_is_vllms_own(tmp_path: Path) -> None:
    """wheel_pins.py reads the built wheel's METADATA: FlashInfer's three wheels at exactly vLLM's pin; a
    loose requirement is refused; the real vLLM 0.33.0 METADATA gives 0.7.2.post1 and torch 2.14.0."""
    import sys
    import zipfile

    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from image_fixtures import tool

    pins = tool("wheel_pins")
    whl = tmp_path / "vllm-0.33.0-cp38-abi3-linux_aarch64.whl"
    meta = (REPO / "tests/fixtures/vllm-0.33.0-METADATA").read_text()
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("vllm-0.33.0.dist-info/METADATA", meta)
    assert pins.flashinfer(whl) == ["flashinfer-python==0.7.2.post1", "flashinfer-cubin==0.7.2.post1",
                                    "flashinfer-jit-cache==0.7.2.post1"]
    assert pins.pin(whl, "torch") == "torch==2.14.0"
    loose = tmp_path / "vllm-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(loose, "w") as z:
        z.writestr("vllm-0.0.1.dist-info/METADATA", "Name: vllm\nRequires-Dist: flashinfer-python>=0.6\n")
    with pytest.raises(pins.Refusal, match="no exact Requires-Dist pin for flashinfer-python"):
        pins.flashinfer(loose)
    req = tmp_path / "cuda.txt"
    req.write_text("-r common.txt\n# torch\ntorch==2.14.0\n")
    (tmp_path / "common.txt").write_text("numpy\n")
    assert pins.requirement("torch", [req]) == "torch==2.14.0"
    req.write_text("torch>=2.13\n")
    with pytest.raises(pins.Refusal, match="no exact '==' pin"):
        pins.requirement("torch", [req])


def test_the_census_refuses_a_12_1a_only_build(tmp_path: Path) -> None:
    """A 12.1a-only arch list drops the 12.0f family kernels: the census names it; "12.0 12.1a" passes."""
    import sys
    import zipfile

    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from image_fixtures import NEW_A, NEW_ABI, PLAIN, elf_with_fatbin, tool

    pins = tool("wheel_pins")

    def wheel(entries: list) -> Path:
        whl = tmp_path / f"vllm-{len(entries)}.whl"
        with zipfile.ZipFile(whl, "w") as z:
            for lib in ("vllm/_C.abi3.so", "vllm/_moe_C.abi3.so"):
                z.writestr(lib, elf_with_fatbin(entries))
        return whl

    a121 = (2, 121, PLAIN | NEW_ABI | NEW_A, b"\0" * 16)
    f120 = (2, 120, PLAIN | NEW_ABI, b"\0" * 16)
    only_121a = wheel([a121])
    with pytest.raises(pins.Refusal, match="no sm_120/sm_120f family cubin"):
        pins.census(only_121a, 121, 120)
    assert pins.census(only_121a, 121) == ["vllm/_C.abi3.so: sm_121a", "vllm/_moe_C.abi3.so: sm_121a"]
    both = wheel([f120, a121])
    assert pins.census(both, 121, 120) == ["vllm/_C.abi3.so: sm_120, sm_121a", "vllm/_moe_C.abi3.so: sm_120, sm_121a"]
    with pytest.raises(pins.Refusal, match="no SM9x code that runs on sm_90"):
        pins.census(both, 90)


def test_shipped_locks_agree_with_their_recipes_but_say_unresolved() -> None:
    from sparkserve.image.context import load_recipe_files
    from sparkserve.image.recipe import unresolved_lock

    recipes = [REPO / "docker/recipe.yaml", *sorted((REPO / "docker/recipes").glob("*.yaml"))]
    assert [r.name for r in recipes] == ["recipe.yaml", "card-prebuilt.yaml", "upstream-0.33.0.yaml"]
    for recipe in recipes:
        files = load_recipe_files(recipe)
        assert files.lock is not None
        assert files.lock == unresolved_lock(files.recipe, files.checks)  # nothing hand-written beyond the recipe
        assert files.lock.facts == "unresolved" and files.lock.vllm == {"version": "unresolved",
                                                                         "commit": "unresolved"}
        assert lock_problems(files.recipe, files.lock, files.series, files.checks) == [
            "the lock's facts are unresolved (never read from the image): run `sparkserve image build --relock` "
            "on a node that can pull the base", f"the base {files.recipe.base.image} is not resolved to a digest yet"]


def test_the_default_is_the_cards_lane_and_the_prebuilt_one_checks_the_same_facts() -> None:
    """The card's Dockerfile @121cecc: the fork base by digest, the two files with their sha256, its gate."""
    from sparkserve.image.context import default_recipe, load_recipe_files

    card = load_recipe_files(default_recipe()).recipe
    assert card.lane == "overlay" and card.experimental is None and card.series is None
    assert card.base.image == ("ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v11-dflash2@sha256:"
                               "4def0ef644cb2e9814136dcffd5e385e21bc594f48f3b292234051904abe85a6")
    assert {o.path: o.sha256 for o in card.overlays} == {
        "vllm/model_executor/layers/sparse_attn_indexer_kpool.py":
            "8a3ecfb0bab2441dd7417ed00a10d142191496149f88e5fe79fcfaea4b160980",
        "vllm/v1/core/kv_cache_utils.py": "b894ad440cd4722342484cc751ba65a480c6903368af168386b86ca6768288e0"}
    assert all(str(o.source).startswith("https://raw.githubusercontent.com/canada-quant/") for o in card.overlays)
    assert {(m.file, m.contains) for m in card.checks.markers} == {
        ("vllm/v1/core/kv_cache_utils.py", "DFLASH2-DRAFTER-GROUP"),
        ("vllm/model_executor/layers/sparse_attn_indexer_kpool.py", "topk_indices_buffer")}
    assert card.checks.registry == ["Glm5NextForConditionalGeneration"]
    prebuilt = load_recipe_files(REPO / "docker/recipes/card-prebuilt.yaml").recipe
    assert prebuilt.lane == "prebuilt"
    assert prebuilt.base.image == "ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e"
    assert [(o.path, o.sha256) for o in prebuilt.overlays] == [(o.path, o.sha256) for o in card.overlays]
    assert prebuilt.checks == card.checks and prebuilt.vllm == card.vllm
    upstream = load_recipe_files(REPO / "docker/recipes/upstream-0.33.0.yaml").recipe
    assert "Failed to run MLA, error: invalid argument" in " ".join(str(upstream.experimental).split())


def test_recipe_overlays_are_checked_fields() -> None:
    base = RECIPE + "overlays:\n  - {path: vllm/a.py, source: a.py, sha256: '%s'}\n"
    assert parse_recipe(base % ("ab" * 32), "r.yaml").overlays[0].path == "vllm/a.py"
    with pytest.raises(BadInput, match="overlays.0.sha256: must be 64 lowercase hex"):
        parse_recipe(base % "abc", "r.yaml")
    with pytest.raises(BadInput, match="must be a relative .py path"):
        parse_recipe(base.replace("vllm/a.py", "../etc/passwd") % ("ab" * 32), "r.yaml")
    with pytest.raises(BadInput, match="overlays: vllm/a.py has no source"):
        parse_recipe(base.replace("source: a.py, ", "") % ("ab" * 32), "r.yaml")
    with pytest.raises(BadInput, match="flashinfer_ref: FlashInfer is pinned to exactly what the vLLM"):
        parse_recipe(RECIPE.replace("lane: overlay", "lane: source") + "source: {cuda_devel_image: a, "
                     "cuda_runtime_image: b, flashinfer_ref: v0.6.1}\n", "r.yaml")
    recipe = parse_recipe(base % ("ab" * 32), "r.yaml")
    lock = _lock(patches=[], overlays={"vllm/a.py": "cd" * 32})
    assert "overlays changed since the lock was written (vllm/a.py)" in lock_problems(recipe, lock, [])
    assert "the recipe's marker/registry checks changed since the lock was written" in lock_problems(
        recipe.model_copy(update={"checks": Checks(registry=["X"])}), lock, [])


def test_image_build_refuses_the_unresolved_lock_before_touching_a_node(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes: [{name: a, host: 192.0.2.1, fabric_ip: 192.0.2.1}]\n")  # unreachable if touched
    upstream = str(REPO / "docker/recipes/upstream-0.33.0.yaml")
    cases = (([], "recipe", "the lock's facts are unresolved"),
             (["--local", "--recipe", upstream, "--lane", "source"], "upstream-0.33.0",  # the workflow's source step
              "lane is 'source', the lock's is 'overlay'"))
    for extra, name, why in cases:
        res = subprocess.run([str(REPO / ".venv/bin/sparkserve"), "image", "build", "-c", str(cfg), *extra],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stderr
        first = next(ln for ln in res.stderr.splitlines() if not ln.startswith("warning: "))
        assert first.startswith(f"error: {REPO / 'docker'}") and f"{name}.lock.json: the lock disagrees with " \
            f"{name}.yaml: {why}" in first, res.stderr
        assert "Traceback" not in res.stderr


def test_image_build_help_labels_the_upstream_lane_experimental() -> None:
    res = subprocess.run([str(REPO / ".venv/bin/sparkserve"), "image", "build", "--help"], capture_output=True,
                         text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    text = " ".join(res.stdout.split())
    assert res.returncode == 0
    assert "upstream-0.33.0.yaml is EXPERIMENTAL" in text and "Failed to run MLA, error: invalid argument" in text
    assert "card-prebuilt.yaml uses the card's published image as it is" in text
    assert 'stays marked "not GPU-verified"' in text
    docs = " ".join((REPO / "docs/how-to/image.md").read_text().split())
    assert "`docker/recipes/upstream-0.33.0.yaml` | overlay (or `--lane source`) | **EXPERIMENTAL.**" in docs
    assert "Failed to run MLA, error: invalid argument" in docs and "## The upstream lane (EXPERIMENTAL)" in docs


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
    assert any("no patch or overlay touches: vllm/b.py" in p
               for p in facts_problems(_facts(["vllm/a.py", "vllm/b.py"]), lock))
    assert any("still match the wheel: vllm/a.py" in p for p in facts_problems(_facts([]), lock))
    assert any("vllm/a.py is 444444444444" in p for p in facts_problems(_facts(["vllm/a.py"], "44" * 32), lock))
    assert any("version is '0.32.0'" in p for p in facts_problems(_facts(["vllm/a.py"], version="0.32.0"), lock))
    no_dflash = {**_facts(["vllm/a.py"]), "dflash2": {}}
    assert "vLLM's registry has no DFlash2DraftModel" in facts_problems(no_dflash, lock)


def test_failing_step_names_the_stage_and_its_last_lines() -> None:
    from sparkserve.image.build import failing_step

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

    from sparkserve.image.on_nodes import identity_of

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
    from sparkserve.image.build import _check_platform
    from sparkserve.nodes.base import NodeError

    no_handler = _RunNode({"uname": (0, "x86_64\n"), "cat": (1, "")})
    with pytest.raises(NodeError) as e:
        _check_platform(no_handler, "linux/arm64")  # type: ignore[arg-type]
    assert "--platform linux/arm64 on a x86_64 node needs qemu user emulation" in e.value.what
    assert "/proc/sys/fs/binfmt_misc/qemu-aarch64 is not registered" in e.value.what
    _check_platform(_RunNode({"uname": (0, "x86_64\n"), "cat": (0, "enabled\n")}), "linux/arm64")  # type: ignore[arg-type]
    _check_platform(_RunNode({"uname": (0, "aarch64\n")}), "linux/arm64")  # type: ignore[arg-type]  # native


def test_builder_is_buildx_else_an_old_cli_with_buildkit_else_a_clear_refusal() -> None:
    from sparkserve.image.build import builder_argv
    from sparkserve.nodes.base import NodeError

    assert builder_argv(_RunNode({"docker buildx version": (0, "v0.19")})) == ["docker", "buildx", "build", "--load"]  # type: ignore[arg-type]
    old = _RunNode({"docker buildx version": (1, ""), "docker version --format {{.Client.Version}}": (0, "28.2.2"),
                    "/usr/bin/docker version --format {{.Client.Version}}": (0, "20.10.24+dfsg1")})
    assert builder_argv(old) == ["env", "DOCKER_BUILDKIT=1", "/usr/bin/docker", "build"]  # type: ignore[arg-type]
    new_only = _RunNode({"docker buildx version": (1, ""), "docker version --format {{.Client.Version}}": (0, "28.2.2"),
                         "/usr/bin/docker version --format {{.Client.Version}}": (0, "28.2.2")})
    with pytest.raises(NodeError, match="install the docker-buildx plugin"):
        builder_argv(new_only)  # type: ignore[arg-type]
