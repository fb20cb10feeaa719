"""The engine's flag dialect read from the image itself, and kept with the image facts.

    found = read_dialect(node, ref)                  # {"vllm_version", "options", "how", "error"} from inside
    remember(ref, image_id, found)                   # next to the journal: plan/dialects.py reads it
    d = dialect_for(cfg, image_id=image_id)          # the plan, validate and the launcher then use it

``image verify`` runs the facts program (docker/tools/image_facts.py ``--serve-dialect``) in the image on the
head: the image's own ``vllm serve`` parser dumped when vllm imports there (option list + version string),
else the version its ``vllm --version`` prints (then the shipped dialect of that version applies). The facts are
kept per image ref with the image ID they were read from; ``up`` ignores facts of another image ID. The same
answer carries the check of vLLM's declared dependencies (:mod:`sparkserve.image.requires`), kept by image ID.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from sparkserve.image.run import facts_program, run_in_image
from sparkserve.nodes.base import Node, NodeError
from sparkserve.plan.dialects import Dialect, dialect_from_facts, stored_facts, write_facts

DUMP_TIMEOUT_S = 600.0  # importing a real vLLM's parser takes tens of seconds on a busy node


def read_dialect(node: Node, image: str) -> dict[str, Any]:
    """The image's own dialect facts (NodeError when the facts program cannot run in the image)."""
    rc, out, err = run_in_image(node, image, ["python3", "-c", facts_program(), "--serve-dialect"],
                                step="image dialect", timeout=DUMP_TIMEOUT_S)
    if rc != 0:
        raise NodeError(node.name, "image dialect", f"the facts program failed in {image} (exit {rc})",
                        last_lines=err.strip().splitlines()[-10:])
    found = json.loads(out.strip().splitlines()[-1])
    return dict(found) if isinstance(found, dict) else {}


def remember(ref: str, image_id: str, found: dict[str, Any]) -> Path:
    """Keep ``found`` for ``ref`` (read from ``image_id``) in the stored image facts; returns the file."""
    data = stored_facts()
    by_ref = data.setdefault("by_ref", {})
    by_ref[ref] = {"image_id": image_id, "vllm_version": found.get("vllm_version"), "options": found.get("options"),
                   "how": found.get("how"), "error": found.get("error")}
    return write_facts(data)


def verify_dialect(node: Node, ref: str, image_id: str) -> tuple[Dialect | None, dict[str, Any]]:
    """Read ``ref``'s dialect on ``node``, keep it, and return the dialect it names (None: neither the image's
    parser nor a shipped dialect of its version) with the raw facts."""
    from sparkserve.image.requires import remember_requires

    found = read_dialect(node, ref)
    with contextlib.suppress(OSError):  # an unusable state dir: the dialect serves this run, it is just not kept
        remember(ref, image_id, found)
    remember_requires(image_id, found.get("requires"))  # the same program answered it: `up` need not ask again
    return dialect_from_facts(ref, {"image_id": image_id, **found}), found
