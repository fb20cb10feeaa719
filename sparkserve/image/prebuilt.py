"""The ``prebuilt`` lane of `image build`: an image used as it is — pinned by digest, checked, never built.

    result = use_prebuilt(node, files, lock)      # BuildResult: the image's own ID, no build log

The model card publishes its serving image (``ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e``).
This lane pulls it on the node by the lock's digest, then holds it to the same facts the card lane's build
gate checks — only the overlays differ from vLLM's RECORD, each with its sha256, the markers and the
registry checks (the applier with ``--verify-only``, in a throwaway container) — its vLLM version and
commit to the lock's, and every distribution its vLLM requires installed (:mod:`sparkserve.image.requires`).
It is tagged ``<recipe name>:<lock sha256[:12]>`` on the node (a tag, not a change: the
content fingerprint stays the card's). The GPU smoke stage runs as after a build, but its pass cannot be
written into an image that stays as it is: the result is reported, and the image's facts keep no mark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import docker.errors

from sparkserve.errors import GateFailed
from sparkserve.image.base_names import pull_errors
from sparkserve.image.build import TAIL_LINES, BuildFailed, BuildResult, gpu_stage, push_image, untag
from sparkserve.image.context import RecipeFiles, context_files, overlay_bytes
from sparkserve.image.on_nodes import image_identity
from sparkserve.image.recipe import Lock, image_tag, lock_digest
from sparkserve.image.requires import parse_requires
from sparkserve.image.run import image_facts, run_in_image
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.docker_client import docker_errors

Reporter = Callable[[str], None]


def use_prebuilt(node: Node, files: RecipeFiles, lock: Lock, *, overlays: dict[str, bytes] | None = None,
                 push: str | None = None, say: Reporter | None = None, gpu_capability: str = "12.1") -> BuildResult:
    say = say or (lambda _s: None)
    t0 = time.monotonic()
    overlays = overlay_bytes(files) if overlays is None else overlays
    ref = lock.base.digest_ref or lock.base.id
    if ref is None:
        raise NodeError(node.name, "prebuilt", f"the lock does not pin {lock.base.image}; re-lock")
    with pull_errors(node, "prebuilt", ref):
        client = node.docker()
        try:
            img = client.images.get(ref)
        except docker.errors.ImageNotFound:
            if lock.base.digest_ref is None:
                raise NodeError(node.name, "prebuilt", f"{lock.base.image} ({ref[:19]}) is not on this node and was "
                                "never pushed; re-lock") from None
            say(f"pulling {ref} on {node.name}")
            img = client.images.pull(ref, platform=files.recipe.base.platform)
    if lock.base.id is not None and str(img.id) != lock.base.id:
        raise NodeError(node.name, "prebuilt", f"{lock.base.image} is {str(img.id)[:19]} here, the lock pins "
                        f"{lock.base.id[:19]}; re-lock")
    say(f"checking {ref} as it is: overlays, markers, registry (the card's gate)")
    for line in verify_in_image(node, files, str(img.id), overlays, step="prebuilt"):
        if line.startswith("==> "):
            say(line.removeprefix("==> "))
    facts = image_facts(node, str(img.id))
    vllm = facts.get("vllm") or {}
    problems = [f"vLLM {k} is {vllm.get(k)!r}, the lock says {lock.vllm.get(k)!r}" for k in ("version", "commit")
                if vllm.get(k) != lock.vllm.get(k)]
    requires = parse_requires(facts.get("requires"))  # what its vLLM declares and the image lacks
    problems += [line for line in (requires.missing_line("in the image") if requires else None,) if line]
    if problems:
        raise GateFailed(f"{node.name}: prebuilt", f"{ref}: {problems[0]}", details=problems[1:])
    tag = image_tag(files.recipe, lock)
    repo, _, version = tag.rpartition(":")
    with docker_errors(node, "prebuilt", f"tag {tag}"):
        img.tag(repo, version)
    try:
        gpu = gpu_stage(node, tag, want_capability=gpu_capability, say=say, mark=False)
    except (GateFailed, NodeError):
        untag(node, tag)
        say(f"GPU smoke failed: removed the tag {tag}")
        raise
    if gpu.ok:
        say("(a prebuilt image stays as it is: the pass is reported here, not written into it)")
    found = image_identity(node, tag)
    assert found is not None
    pushed = push_image(node, tag, push, say=say) if push else None
    return BuildResult(node.name, tag, found[0], found[1], lock_digest(lock), time.monotonic() - t0,
                       Path("(prebuilt: no build log)"), facts, pushed, gpu.as_json())


def verify_in_image(node: Node, files: RecipeFiles, image: str, overlays: dict[str, bytes], *,
                    step: str = "verify") -> list[str]:
    """The card's gate on an image as it is (the applier with ``--verify-only``): only the overlays differ
    from RECORD, each holds its sha256, the markers and the registry checks hold. BuildFailed naming the
    first thing that does not; the applier's lines otherwise."""
    argv = ["python3", "/ctx/tools/apply_series.py", "--overlays", "/ctx/overlays.json", "--verify-only",
            "--checks", "/ctx/upstream-checks.json"]
    rc, out, err = run_in_image(node, image, argv, files=context_files(files, None, overlays), step=step)
    lines = (out + err).strip().splitlines()
    if rc != 0:
        raise BuildFailed(f"{node.name}: {step}", next((ln.removeprefix("apply_series: error: ") for ln in
                          reversed(lines) if ln.startswith("apply_series: error:")), f"the check exited {rc}"),
                          node=node.name, step=step, details=lines[-TAIL_LINES:])
    return lines
