"""Rank parity: every rank's running container must be the head's, but for what is meant to differ.

A drifted worker (another image, one flag changed by hand, a stale mount) is the classic two-node bug: the
stack boots and serves wrong or slow results. :func:`check_parity` compares what docker reports for each
running container, and the error names the flag that changed, not just "argv differs".
"""

from __future__ import annotations

from typing import Any

from sparkserve.config import Config
from sparkserve.errors import RemoteFailure
from sparkserve.image.on_nodes import identity_of
from sparkserve.nodes.base import Node
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.runtime import engine_for

PARITY_KEYS = ("image_id", "argv", "env", "mounts")


def check_parity(cfg: Config, nodes: dict[str, Node], containers: dict[str, str]) -> None:
    """Every rank's container must match the head's: image ID, argv minus rank flags, env minus
    per-node fabric values, mounts (``parity_facts`` of the runtime leaves out what is meant to differ).

    Raises RemoteFailure(step="rank parity") naming the first rank that drifted and how. A one-rank stack has
    nothing to compare: no node is asked (issue 43: `up`'s own seconds on one GPU)."""
    if len(cfg.nodes) < 2:
        return

    def one(name: str) -> dict[str, object]:
        f = engine_for(nodes[name], cfg).parity_facts(containers[name])
        if cfg.runtime == "docker":  # compare content fingerprints: the containerd store reports other raw IDs
            f = {**f, "image_id": identity_of(nodes[name], str(f.get("image_id")))}
        return f

    facts = on_all([n.name for n in cfg.nodes], one)  # each node's two questions in one pass, all at once
    head = cfg.head.name
    ref = facts[head]
    for name, f in facts.items():
        if name == head:
            continue
        for key in PARITY_KEYS:
            if key == "argv" and cfg.serve.executor == "ray":
                continue  # ray workers run `ray start`; the serve argv runs on the head only
            if f.get(key) != ref.get(key):
                what = f"{key} differs from {head}: {describe_difference(ref.get(key), f.get(key))}"
                raise RemoteFailure(f"{name}: rank parity", what, node=name, step="rank parity")


def describe_difference(head: Any, rank: Any) -> str:
    """One line saying how a rank's value differs from the head's: the changed flags of an argv, the
    changed keys of an env, the items only one side has."""
    if isinstance(head, list) and isinstance(rank, list):
        if len(head) == len(rank) and all(isinstance(x, str) for x in head + rank):
            at = [i for i, (x, y) in enumerate(zip(head, rank, strict=True)) if x != y]
            return "; ".join(f"head has {_flag_and_value(head, i)!r}, this rank has {_flag_and_value(rank, i)!r}"
                             for i in at[:3])
        only_head = [x for x in head if x not in rank]
        only_rank = [x for x in rank if x not in head]
        return f"head has {only_head or '[]'}, this rank has {only_rank or '[]'}"
    if isinstance(head, dict) and isinstance(rank, dict):
        keys = sorted(k for k in set(head) | set(rank) if head.get(k) != rank.get(k))
        return ", ".join(f"{k}: {head.get(k)!r} vs {rank.get(k)!r}" for k in keys[:5])
    return f"{str(head)[:60]} vs {str(rank)[:60]}"


def _flag_and_value(argv: list[str], i: int) -> str:
    """``--flag value`` around position ``i`` of an argv (just the item when it is not a flag's value)."""
    if i > 0 and argv[i - 1].startswith("-") and not argv[i].startswith("-"):
        return f"{argv[i - 1]} {argv[i]}"
    return argv[i]
