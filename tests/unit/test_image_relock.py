"""The source lane's lock is checked like the overlay's: every recipe field it pins is named when it
disagrees, an unresolved pin is named, and a lane the recipe cannot build is usage (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.image.context import RecipeFiles
from sparkserve.image.recipe import BaseLock, Lock, parse_recipe
from sparkserve.image.relock import effective_recipe, require_lock, source_fields, source_lock_problems

RECIPE = """name: t/vllm
lane: source
base: {image: 'vllm/vllm-openai:v0.33.0'}
vllm: {version: 0.33.0, ref: v0.33.0}
series: series
source: {cuda_devel_image: 'nvidia/cuda:13-devel', cuda_runtime_image: 'nvidia/cuda:13-runtime'}
"""
COMMIT = "a" * 40
DIGEST = "nvidia/cuda@sha256:" + "b" * 64


def _lock(recipe_text: str = RECIPE, **source: str | None) -> Lock:
    recipe = parse_recipe(recipe_text, "r.yaml")
    pins: dict[str, str | None] = {**source_fields(recipe), "cuda_devel_image": DIGEST, "cuda_devel_id": None,
                                   "cuda_runtime_image": "nvidia/cuda:13-runtime",
                                   "cuda_runtime_id": "sha256:" + "c" * 64}
    pins.update(source)
    return Lock(recipe=recipe.name, lane="source", base=BaseLock(image=recipe.base.image),
                vllm={"version": "0.33.0", "commit": COMMIT}, source=pins, facts={})


def _files(recipe_text: str, lock: Lock | None) -> RecipeFiles:
    return RecipeFiles(Path("r.yaml"), parse_recipe(recipe_text, "r.yaml"), Path("r.lock.json"), lock, "", [], None)


def test_a_resolved_source_lock_of_the_recipe_has_no_problems() -> None:
    assert source_lock_problems(parse_recipe(RECIPE, "r.yaml"), _lock()) == []
    assert require_lock(_files(RECIPE, _lock())).lane == "source"  # the overlay base needs no digest here


@pytest.mark.parametrize(("edit", "named"), [
    (("'nvidia/cuda:13-runtime'}", "'nvidia/cuda:13-runtime', torch_index: 'https://download.pytorch.org/whl/cu129'}"),
     "source torch_index is 'https://download.pytorch.org/whl/cu129', the lock's is "
     "'https://download.pytorch.org/whl/cu130'"),
    (("cuda:13-devel", "cuda:13.1-devel"), "source cuda_devel is 'nvidia/cuda:13.1-devel'"),
    (("ref: v0.33.0", "ref: v0.33.1"), "source vllm_ref is 'v0.33.1', the lock's is 'v0.33.0'"),
    (("series: series", "series: series\ntorch_cuda_arch_list: '12.1a'"), "source torch_cuda_arch_list is '12.1a'"),
    (("series: series", "series: series\nextra_pip: ['nvidia-nccl-cu13==2.30.7']"),
     "source extra_pip is 'nvidia-nccl-cu13==2.30.7', the lock's is ''"),
])
def test_each_recipe_edit_makes_the_source_lock_stale(edit: tuple[str, str], named: str) -> None:
    text = RECIPE.replace(*edit)
    with pytest.raises(BadInput) as err:
        require_lock(_files(text, _lock()))
    assert named in err.value.line() and "re-lock with --relock" in err.value.line()


def test_unresolved_source_pins_are_named() -> None:
    recipe = parse_recipe(RECIPE, "r.yaml")
    lock = _lock(cuda_devel_image="nvidia/cuda:13-devel", cuda_runtime_id=None)
    lock.vllm["commit"] = "v0.33.0"
    assert source_lock_problems(recipe, lock) == [
        "the cuda devel image 'nvidia/cuda:13-devel' is not resolved to a digest yet",
        "the cuda runtime image 'nvidia/cuda:13-runtime' is not resolved to a digest yet",
        "vllm.ref 'v0.33.0' is not resolved to a 40-hex commit yet"]


def test_an_overlay_lock_is_refused_for_the_source_lane_and_back() -> None:
    overlay = RECIPE.replace("lane: source", "lane: overlay")
    lock = _lock()
    with pytest.raises(BadInput, match="lane is 'overlay', the lock's is 'source'"):
        require_lock(_files(overlay, lock))
    with pytest.raises(BadInput, match="lane is 'overlay', the lock's is 'source'"):
        require_lock(_files(RECIPE, lock), lane="overlay")
    assert require_lock(_files(overlay, lock), lane="source").lane == "source"


def test_the_source_lane_needs_a_source_section() -> None:
    text = RECIPE.replace("lane: source", "lane: overlay").split("source:", 1)[0]
    with pytest.raises(BadInput) as err:
        effective_recipe(_files(text, None), "source")
    assert err.value.line().startswith("error: --lane: r.yaml has no source section")


def test_the_source_lane_refuses_a_node_that_is_not_an_aarch64_spark() -> None:
    """What cannot be made right off a Spark (kernels for SM12x, the FlashInfer wheels, the GPU smoke) is
    refused with the reason, before any build starts."""
    from sparkserve.image.build import check_source_node
    from sparkserve.nodes.base import CommandResult, NodeError

    class Node:
        name = "head"

        def __init__(self, machine: str) -> None:
            self.machine = machine

        def run(self, argv, **_kw):  # type: ignore[no-untyped-def]
            return CommandResult(list(argv), 0, self.machine + "\n", "")

    with pytest.raises(NodeError) as e:
        check_source_node(Node("x86_64"), None)  # type: ignore[arg-type]
    assert "builds only natively on an aarch64 SM12x node (a DGX Spark); head is x86_64" in e.value.what
    with pytest.raises(NodeError, match="--platform is linux/amd64"):
        check_source_node(Node("aarch64"), "linux/amd64")  # type: ignore[arg-type]
    check_source_node(Node("aarch64"), "linux/arm64")  # type: ignore[arg-type]


def test_lock_facts_come_from_the_image_facts_and_its_serve_dialect() -> None:
    """The lock's facts (issue 23): package versions from the image's facts, the serve dialect from issue
    21's ``image_facts.py --serve-dialect`` (here: the committed 0.33.0 option list as the image's dump)."""
    import json

    from sparkserve.image.relock import lock_facts

    dump = json.loads((Path(__file__).resolve().parents[2] / "sparkserve/data/vllm-0.33.0-serve-args.json")
                      .read_text())
    facts = {"python": "3.12.3", "packages": {"flashinfer-python": "0.7.2.post1", "flashinfer-cubin": "0.7.2.post1",
                                              "flashinfer-jit-cache": None, "torch": "2.14.0+cu130",
                                              "triton": "3.6.0", "torch_cuda": "13.0"}}
    found = lock_facts(facts, {"vllm_version": "0.33.0", "options": dump, "how": "parser", "error": None})
    assert {k: v for k, v in found.items() if k != "dialect"} == {
        "flashinfer": "0.7.2.post1", "flashinfer_cubin": "0.7.2.post1", "flashinfer_jit_cache": None,
        "torch": "2.14.0+cu130", "triton": "3.6.0", "cuda": "13.0", "python": "3.12.3"}
    dialect = found["dialect"]
    assert dialect["how"] == "parser" and dialect["vllm_version"] == "0.33.0"
    assert dialect["num_option_strings"] == dump["num_option_strings"] == len(dialect["option_strings"])
    assert "--kv-cache-memory-bytes" in dialect["option_strings"] and len(dialect["sha256"]) == 64
    bare = lock_facts(facts, {"vllm_version": "0.1.dev20051+g487ecf187", "options": None, "how": "vllm --version",
                              "error": "ModuleNotFoundError: No module named 'torch'"})
    assert bare["dialect"]["option_strings"] == [] and bare["dialect"]["how"] == "vllm --version"
