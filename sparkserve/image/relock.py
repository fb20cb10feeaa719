"""The lock of each lane: written by ``image build --relock`` on a node, checked before every build.

    lock = require_lock(files, lane="source")     # BadInput (exit 2) naming each disagreement, no node touched
    lock = relock(node, files, lane="source")     # resolve the pins there, digest the series

**overlay**: the base resolved to ``repo@sha256:…`` (its image ID when it was never pushed), vLLM's
version/commit and the other facts found in the base (:func:`lock_facts`: FlashInfer, torch, CUDA, its serve
dialect), the overlays' digests and the checks, each patch's sha256 and the sha256 of every file it touches
before and after (the overlays copied and the series applied in a throwaway container of the base).

**prebuilt**: the same facts of the image itself, after the card's gate held in it (``--verify-only``).

**source**: what the recipe's ``source`` section and ``vllm.ref`` say, resolved on the node: the CUDA devel
and runtime images pinned like a base, ``vllm.ref`` resolved to its 40-hex commit (as given, or by ``git
ls-remote`` on the node), and the recipe's torch/FlashInfer indexes, arch list and pins recorded, so that editing any
of them makes the lock stale. A non-empty series is digested against the vLLM tree of ``base.image`` (a
release's wheel holds the checkout's Python files unchanged); the source build's applier checks every
touched file in the checkout against those digests again, so a checkout that differs is refused there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import docker.errors

from sparkserve.errors import BadInput
from sparkserve.image.base_names import digest_of, pull_errors, pull_hint
from sparkserve.image.build import TAIL_LINES, BuildFailed
from sparkserve.image.context import RecipeFiles, context_files, overlay_bytes
from sparkserve.image.recipe import (
    DIGEST_REF,
    IMAGE_ID,
    BaseLock,
    Lock,
    PatchLock,
    Recipe,
    lock_checks,
    lock_problems,
    sha256_hex,
)
from sparkserve.image.run import image_facts, run_in_image
from sparkserve.nodes.base import Node, NodeError

Reporter = Callable[[str], None]
COMMIT = re.compile(r"^[0-9a-f]{40}$")
VLLM_REPO = "https://github.com/vllm-project/vllm.git"
_BASE_PROBLEMS = ("the base ", "base.digest_ref ", "base.id ")  # the source lane never builds FROM the base


def effective_recipe(files: RecipeFiles, lane: str | None) -> Recipe:
    """The recipe as this build sees it: ``--lane`` overrides the recipe's lane (BadInput when the source
    lane is asked for and the recipe has no ``source`` section)."""
    recipe = files.recipe
    if lane is None or lane == recipe.lane:
        return recipe
    if lane == "source" and recipe.source is None:
        raise BadInput("--lane", f"{files.path.name} has no source section (cuda_devel_image, "
                       "cuda_runtime_image) for the source lane")
    return recipe.model_copy(update={"lane": lane})


def source_fields(recipe: Recipe) -> dict[str, str]:
    """What the source lane's lock records from the recipe (an edit to any of them makes it stale)."""
    assert recipe.source is not None
    return {"cuda_devel": recipe.source.cuda_devel_image, "cuda_runtime": recipe.source.cuda_runtime_image,
            "torch_index": recipe.source.torch_index, "flashinfer_index": recipe.source.flashinfer_index,
            "flashinfer": "the vLLM wheel's own pin (its METADATA)", "vllm_ref": recipe.vllm.ref,
            "torch_cuda_arch_list": recipe.torch_cuda_arch_list, "extra_pip": " ".join(recipe.extra_pip)}


def source_lock_problems(recipe: Recipe, lock: Lock) -> list[str]:
    """Each way ``lock.source`` is not the source lane's lock of ``recipe`` (empty: it is)."""
    src = lock.source
    if not src:
        return ["the lock has no source-lane pins (CUDA images, vLLM commit); re-lock for the source lane"]
    out = []
    for key, want in source_fields(recipe).items():
        if src.get(key) != want:
            out.append(f"source {key} is {want!r}, the lock's is {src.get(key)!r}")
    for key in ("cuda_devel", "cuda_runtime"):
        pinned, image_id = src.get(f"{key}_image") or "", src.get(f"{key}_id")
        if not (DIGEST_REF.match(pinned) or (image_id and IMAGE_ID.match(image_id))):
            out.append(f"the {key.replace('_', ' ')} image {src.get(key)!r} is not resolved to a digest yet")
    if not COMMIT.match(lock.vllm.get("commit") or ""):
        out.append(f"vllm.ref {recipe.vllm.ref!r} is not resolved to a 40-hex commit yet")
    return out


def require_lock(files: RecipeFiles, lane: str | None = None) -> Lock:
    """The lock, when it is this recipe's for ``lane`` (default: the recipe's); BadInput (exit 2) naming
    every disagreement otherwise — before any node is touched."""
    recipe = effective_recipe(files, lane)
    if files.lock is None:
        raise BadInput(str(files.lock_path), "no lock for this recipe yet; run `sparkserve image build --relock`")
    problems = lock_problems(recipe, files.lock, files.series, files.checks)
    if recipe.lane == "source":
        problems = [p for p in problems if not p.startswith(_BASE_PROBLEMS)]
        if files.lock.lane == "source":
            problems += source_lock_problems(recipe, files.lock)
    if problems:
        raise BadInput(str(files.lock_path), f"the lock disagrees with {files.path.name}: {problems[0]}; "
                       "re-lock with --relock", details=problems[1:])
    return files.lock


def relock(node: Node, files: RecipeFiles, *, lane: str | None = None, pull: bool = True,
           say: Reporter | None = None, overlays: dict[str, bytes] | None = None) -> Lock:
    """A fresh lock for the recipe's ``lane`` (default: the recipe's), resolved on ``node`` (module docstring)."""
    say = say or (lambda _s: None)
    recipe = effective_recipe(files, lane)
    if recipe.lane == "source":
        return _relock_source(node, files, recipe, pull=pull, say=say)
    overlays = overlay_bytes(files) if overlays is None else overlays
    base_lock, image_id = resolve_image(node, recipe.base.image, recipe.base.platform, pull=pull, say=say)
    say(f"{'image' if recipe.lane == 'prebuilt' else 'base'} {recipe.base.image} is "
        f"{base_lock.digest_ref or base_lock.id}")
    facts = image_facts(node, image_id)
    vllm = facts.get("vllm") or {}
    if recipe.lane == "prebuilt":
        from sparkserve.image.prebuilt import verify_in_image

        verify_in_image(node, files, image_id, overlays, step="relock")
        patches: list[PatchLock] = []
    else:
        patches = _digest_series(node, files, image_id, overlays)
    from sparkserve.image.dialect import read_dialect  # issue 21's reader: the image's own parser

    found = lock_facts(facts, read_dialect(node, image_id))
    say(f"read from the image: vLLM {vllm.get('version')} ({vllm.get('commit')}), "
        + ", ".join(f"{k} {v}" for k, v in found.items() if k != "dialect")
        + f", serve dialect: {(found['dialect'] or {}).get('num_option_strings') or 'no'} option strings")
    return Lock(recipe=recipe.name, lane=recipe.lane, base=base_lock,
                vllm={"version": vllm.get("version"), "commit": vllm.get("commit")}, patches=patches,
                upstream_checks_sha256=sha256_hex(files.checks) if files.checks is not None else None,
                overlays={o.path: o.sha256 for o in recipe.overlays}, checks=lock_checks(recipe), facts=found)


def lock_facts(facts: dict, dialect: dict | None = None) -> dict[str, object]:
    """What a lock records from running the image, beside vLLM's version and commit: FlashInfer (and its cubin
    and jit-cache wheels), torch, Triton, the CUDA torch was built with, Python, and the image's ``vllm serve``
    dialect as ``image_facts.py --serve-dialect`` reads it: how (its own parser, or ``vllm --version``), the
    version it states, every option string (sorted) and the sha256 of the whole dump."""
    pkgs = facts.get("packages") or {}
    out: dict[str, object] = {
        "flashinfer": pkgs.get("flashinfer-python"), "flashinfer_cubin": pkgs.get("flashinfer-cubin"),
        "flashinfer_jit_cache": pkgs.get("flashinfer-jit-cache"), "torch": pkgs.get("torch"),
        "triton": pkgs.get("triton"), "cuda": pkgs.get("torch_cuda"), "python": facts.get("python"), "dialect": None}
    if dialect:
        options = (dialect.get("options") or {}).get("options") or []
        strings = sorted({s for o in options for s in o.get("option_strings") or []})
        out["dialect"] = {"how": dialect.get("how"), "vllm_version": dialect.get("vllm_version"),
                          "num_option_strings": len(strings), "option_strings": strings,
                          "sha256": sha256_hex(json.dumps(dialect.get("options"), sort_keys=True).encode()),
                          "error": dialect.get("error")}
    return out


def _relock_source(node: Node, files: RecipeFiles, recipe: Recipe, *, pull: bool, say: Reporter) -> Lock:
    assert recipe.source is not None
    pins: dict[str, str | None] = dict(source_fields(recipe))
    for key, image in (("cuda_devel", recipe.source.cuda_devel_image),
                       ("cuda_runtime", recipe.source.cuda_runtime_image)):
        pinned, _ = resolve_image(node, image, recipe.base.platform, pull=pull, say=say)
        pins[f"{key}_image"] = pinned.digest_ref or image
        pins[f"{key}_id"] = pinned.id
        say(f"{key.replace('_', ' ')} {image} is {pinned.digest_ref or pinned.id}")
    commit = resolve_commit(node, recipe.vllm.ref)
    say(f"vllm {recipe.vllm.ref} is {commit}")
    patches: list[PatchLock] = []
    if files.series:  # digested against the release's tree in base.image (module docstring)
        _, base_id = resolve_image(node, recipe.base.image, recipe.base.platform, pull=pull, say=say)
        version = ((image_facts(node, base_id).get("vllm") or {}).get("version"))
        if version != recipe.vllm.version:
            raise NodeError(node.name, "relock", f"the series is digested against {recipe.base.image}'s vLLM "
                            f"tree, but that is vLLM {version}, not {recipe.vllm.version}")
        patches = _digest_series(node, files, base_id)
    return Lock(recipe=recipe.name, lane="source", base=BaseLock(image=recipe.base.image),
                vllm={"version": recipe.vllm.version, "commit": commit}, patches=patches,
                upstream_checks_sha256=sha256_hex(files.checks) if files.checks is not None else None,
                source=pins, overlays={o.path: o.sha256 for o in recipe.overlays}, checks=lock_checks(recipe),
                facts={"read": "from the built image by its smoke test (a source build has no image before it)"})


def resolve_image(node: Node, image: str, platform: str, *, pull: bool, say: Reporter) -> tuple[BaseLock, str]:
    """``image`` on ``node`` (pulled when missing and ``pull``): pinned by its ``repo@sha256:…`` when it came
    from a registry, else by its local image ID. (the pin, the image ID)."""
    with pull_errors(node, "relock", image):
        client = node.docker()
        try:
            img = client.images.get(image)
        except docker.errors.ImageNotFound:
            if not pull:
                raise NodeError(node.name, "relock", f"{image} is not on this node{pull_hint(image)}") from None
            say(f"pulling {image} on {node.name}")
            img = client.images.pull(image, platform=platform)
    repo = image.rsplit("@", 1)[0]
    repo = repo if ":" not in repo.rsplit("/", 1)[-1] else repo.rsplit(":", 1)[0]
    have = list(img.attrs.get("RepoDigests") or [])
    digests = [d for d in have if d.split("@", 1)[0] == repo]
    pinned = digest_of(image) if "@" in image else None
    if not digests and pinned:  # the digest is the identity: the same bytes pulled under another of its names
        digests = [d for d in have if d.endswith("@" + pinned)]
    return (BaseLock(image=image, digest_ref=digests[0] if digests else None, id=None if digests else str(img.id)),
            str(img.id))


def resolve_commit(node: Node, ref: str) -> str:
    """``vllm.ref`` as a 40-hex commit: as given, or the commit ``git ls-remote`` on ``node`` finds for the
    tag or branch (a peeled tag's commit, not the tag object). NodeError saying what to do otherwise."""
    if COMMIT.match(ref):
        return ref
    res = node.run(["git", "ls-remote", "--", VLLM_REPO, f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}",
                    f"refs/heads/{ref}"], timeout=60, check=False, step="relock")
    found = dict(reversed(line.split("\t", 1)) for line in res.stdout.splitlines() if "\t" in line)
    for key in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if COMMIT.match(found.get(key, "")):
            return found[key]
    raise NodeError(node.name, "relock", f"cannot resolve vllm.ref {ref!r} to a commit (git ls-remote "
                    f"{VLLM_REPO} on this node); put the 40-hex commit in vllm.ref", last_lines=res.tail(5))


def _digest_series(node: Node, files: RecipeFiles, image_id: str, overlays: dict[str, bytes] | None = None
                   ) -> list[PatchLock]:
    """Each patch's sha256 and its touched files' before/after sha256: the overlays copied and the series
    applied in a throwaway container of ``image_id`` by the applier the Dockerfile runs."""
    argv = ["python3", "/ctx/tools/apply_series.py", "--series", "/ctx/series/series", "--checks",
            "/ctx/upstream-checks.json", "--overlays", "/ctx/overlays.json", "--relock"]
    rc, out, err = run_in_image(node, image_id, argv, files=context_files(files, None, overlays), step="relock")
    if rc != 0:
        lines = err.strip().splitlines()
        raise BuildFailed(f"{node.name}: relock", (lines[-1] if lines else f"the applier exited {rc}"),
                          node=node.name, step="relock", details=lines[-TAIL_LINES:-1])
    return [PatchLock.model_validate(e) for e in json.loads(out)["patches"]]
