"""`image verify` / `image ship`: the configured engine image, with one ID on every node.

    with open_nodes(cfg) as nodes:
        check = verify_image(cfg, nodes)                       # ImageCheck: every node's ID, ok when all equal
        result = ship_image_everywhere(cfg, nodes, "spark-a")  # ShipResult: copies where it lacks or differs

The judging is :mod:`sparkserve.nodes.images` (the same judge `up` uses before it starts anything).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparkserve.config import Config
from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.images import ShipReport, image_ids, same_image_problem, ship_image

Reporter = Callable[[str], None]


@dataclass(frozen=True)
class ImageCheck:
    """Every node's ID for ``ref`` (None: missing), and why they are not one image (None: they are)."""

    ref: str
    image_ids: dict[str, str | None]
    problem: NodeError | None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def as_json(self) -> dict[str, object]:
        return {"ok": self.ok, "ref": self.ref, "image_ids": dict(self.image_ids)}


@dataclass(frozen=True)
class ShipResult:
    """The source's image ID and one report per node it was shipped to (none: already everywhere)."""

    ref: str
    source: str
    image_id: str
    shipped: dict[str, ShipReport] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {"ref": self.ref, "image_id": self.image_id,
                "shipped": {name: {"bytes": r.bytes, "seconds": round(r.seconds, 2),
                                   "mb_per_s": round(r.mb_per_s, 1)} for name, r in self.shipped.items()}}


def verify_image(cfg: Config, nodes: dict[str, Node]) -> ImageCheck:
    """image.ref's ID on every configured node (in config order)."""
    ids = image_ids([nodes[n.name] for n in cfg.nodes], cfg.image.ref)
    return ImageCheck(cfg.image.ref, ids, same_image_problem(ids, cfg.image.ref))


def ship_source(cfg: Config, source: str | None) -> str:
    """The node to ship from: ``source``, or the head. BadInput (exit 2) when no configured node has that
    name — usage, checked before any node is touched."""
    src = source or cfg.head.name
    names = [n.name for n in cfg.nodes]
    if src not in names:
        raise BadInput("--from", f"no node named {src!r} (nodes: {', '.join(names)})")
    return src


def ship_image_everywhere(cfg: Config, nodes: dict[str, Node], source: str | None = None, *,
                          say: Reporter | None = None) -> ShipResult:
    """Copy image.ref from ``source`` (default: the head) to every node that lacks it or has another ID.

    RemoteFailure when ``source`` is no configured node or lacks the image; ``say`` hears each ship."""
    src = ship_source(cfg, source)
    ref = cfg.image.ref
    ids = image_ids([nodes[n.name] for n in cfg.nodes], ref)
    want = ids[src]
    if want is None:
        raise RemoteFailure(f"{src}: image", f"{ref} is not on {src}; nothing to ship")
    shipped: dict[str, ShipReport] = {}
    for name in (n.name for n in cfg.nodes if ids[n.name] != want):
        if say is not None:
            say(f"shipping {ref} {src} → {name}")
        shipped[name] = ship_image(nodes[src], nodes[name], ref)
    return ShipResult(ref, src, want, shipped)
