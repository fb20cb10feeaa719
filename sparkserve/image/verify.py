"""`image verify` / `image ship`: the configured engine image, the same image on every node.

    with open_nodes(cfg) as nodes:
        check = verify_image(cfg, nodes)                       # ImageCheck: fingerprints + facts per node
        result = ship_image_everywhere(cfg, nodes, "spark-a")  # ShipResult: only the layers each node lacks

"The same image" is the content fingerprint (:mod:`sparkserve.image.identity`), so a node on the
containerd image store and one on the classic store agree on one image. ``verify_image`` also runs the
facts program in the image on every node (no network, no GPU) and compares: the facts must be equal
everywhere and, for an image ``sparkserve image build`` made, match the lock inside it. Among them: every
distribution the image's vLLM requires is installed (:mod:`sparkserve.image.requires`; a problem when one is
missing, a warning when one is outside vLLM's pins), an answer kept by image ID for `up`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparkserve.config import Config
from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.image.base_names import KNOWN, describe, digest_of
from sparkserve.image.identity import facts_problems
from sparkserve.image.on_nodes import image_identity, same_image_problem
from sparkserve.image.registry import ship_via_registry
from sparkserve.image.requires import RequiresCheck, parse_requires, remember_requires
from sparkserve.image.ship import LayerShip, Progress, ship_layers
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.parallel import on_all

Reporter = Callable[[str], None]
#: Facts that must be equal on every node (``site`` and ``machine`` may legitimately differ in a mixed rig).
COMPARED_FACTS = ("vllm", "record", "dflash2", "applied", "lock", "overlays", "registry", "packages", "gpu_smoke")


@dataclass(frozen=True)
class ImageCheck:
    """Every node's raw ID and fingerprint for ``ref`` (None: missing), facts per node, and why they are not
    one image (None: they are)."""

    ref: str
    image_ids: dict[str, str | None]
    fingerprints: dict[str, str | None]
    problem: NodeError | None
    facts: dict[str, dict] = field(default_factory=dict)
    fact_problems: list[str] = field(default_factory=list)
    dialect: dict[str, object] | None = None  # the engine's flag dialect read from the image (kept: image_dialect)

    @property
    def requires(self) -> RequiresCheck | None:
        """The head's check of vLLM's declared dependencies (None: no facts, or an image too old to say)."""
        return parse_requires(next(iter(self.facts.values())).get("requires")) if self.facts else None

    @property
    def requires_warning(self) -> str | None:
        """Distributions installed outside vLLM's pins: said, never a problem (forks pin their own)."""
        return self.requires.mismatch_line() if self.requires is not None else None

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.fact_problems

    def as_json(self) -> dict[str, object]:
        return {"ok": self.ok, "ref": self.ref, "image_ids": dict(self.image_ids),
                "fingerprints": dict(self.fingerprints), "problems": self.problems(),
                "gpu_verified": self.gpu_verified, "gpu": self.gpu_line,
                "facts": {n: {k: f.get(k) for k in ("vllm", "record", "dflash2", "gpu_smoke")}
                          for n, f in self.facts.items()},
                "dialect": self.dialect, "base": self.base,
                "requires": self.requires.as_json() if self.requires is not None else None,
                "warnings": [w for w in (self.requires_warning,) if w]}

    @property
    def base(self) -> dict[str, object] | None:
        """The base the image was built from, by its digest (the lock inside the image; None: no lock there):
        its digest, the name it was built from and every name that digest is known under."""
        lock = next((f.get("lock") for f in self.facts.values() if isinstance(f.get("lock"), dict)), None)
        image = ((lock or {}).get("base") or {}).get("image")
        if not isinstance(image, str):
            return None
        pinned = ((lock or {}).get("base") or {}).get("digest_ref")
        digest = digest_of(image) or (digest_of(pinned) if isinstance(pinned, str) else None)
        return {"digest": digest, "built_from": image, "names": [n.ref for n in KNOWN.get(digest or "", ())],
                "line": f"base: {describe(image) if digest_of(image) else image}"}

    @property
    def gpu_verified(self) -> bool | None:
        """Whether the image's facts carry a passed GPU smoke stage (None: no facts read)."""
        if not self.facts:
            return None
        mark = next(iter(self.facts.values())).get("gpu_smoke")
        return bool(isinstance(mark, dict) and mark.get("verified"))

    @property
    def gpu_line(self) -> str | None:
        from sparkserve.image.gpu_smoke import verification_line

        return verification_line(next(iter(self.facts.values()))) if self.facts else None

    def problems(self) -> list[str]:
        return ([self.problem.line().removeprefix("error: ")] if self.problem else []) + self.fact_problems


@dataclass(frozen=True)
class ShipResult:
    """The source's fingerprint and one report per node it shipped to (none: already everywhere)."""

    ref: str
    source: str
    fingerprint: str
    shipped: dict[str, LayerShip] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {"ref": self.ref, "source": self.source, "fingerprint": self.fingerprint,
                "shipped": {name: {"bytes": r.bytes, "skipped_bytes": r.skipped_bytes, "how": r.how,
                                   "seconds": round(r.seconds, 2), "mb_per_s": round(r.mb_per_s, 1),
                                   **({"push_seconds": round(r.push_seconds, 2)} if r.how == "registry" else {})}
                            for name, r in self.shipped.items()}}


def verify_image(cfg: Config, nodes: dict[str, Node], *, facts: bool = True) -> ImageCheck:
    """image.ref on every configured node (in config order): one fingerprint everywhere, equal facts."""
    from sparkserve.image.run import image_facts

    names = [n.name for n in cfg.nodes]
    ref = cfg.image.ref
    found = on_all(names, lambda name: image_identity(nodes[name], ref))
    ids = {n: (f[0] if f else None) for n, f in found.items()}
    fps = {n: (f[1] if f else None) for n, f in found.items()}
    problem = same_image_problem(fps, ref)
    if problem is not None:  # name it with the raw IDs where they differ too
        problem = same_image_problem(ids, ref) or problem
    per_node: dict[str, dict] = {}
    fact_problems: list[str] = []
    if facts and problem is None:
        per_node = on_all(names, lambda name: image_facts(nodes[name], ref))
        head = names[0]
        for name in names[1:]:
            for key in COMPARED_FACTS:
                if per_node[name].get(key) != per_node[head].get(key):
                    fact_problems.append(f"{name}: image facts differ from {head}'s in {key!r}")
        fact_problems += [f"{head}: {p}" for p in facts_problems(per_node[head], per_node[head].get("lock"))]
        if ids[head]:  # one image on every node (checked above): `up` reads this answer instead of asking again
            remember_requires(str(ids[head]), per_node[head].get("requires"))
    dialect = None
    if facts and problem is None and cfg.runtime == "docker":  # the image's own flag dialect, kept for the plan
        from sparkserve.image.dialect import verify_dialect

        d, raw = verify_dialect(nodes[names[0]], ref, str(ids[names[0]]))
        dialect = {"name": d.name if d else None, "vllm_version": raw.get("vllm_version"), "how": raw.get("how"),
                   "options": len((raw.get("options") or {}).get("options") or []) or None, "error": raw.get("error")}
    return ImageCheck(ref, ids, fps, problem, per_node, fact_problems, dialect)


def ship_source(cfg: Config, source: str | None) -> str:
    """The node to ship from: ``source``, or the head. BadInput (exit 2) when no configured node has that
    name — usage, checked before any node is touched."""
    src = source or cfg.head.name
    names = [n.name for n in cfg.nodes]
    if src not in names:
        raise BadInput("--from", f"no node named {src!r} (nodes: {', '.join(names)})")
    return src


SHIP_VIA = ("stream", "registry")


def ship_via(via: str) -> str:
    """``--via``: ``stream`` (the default) or ``registry``; BadInput (exit 2) otherwise, before any node."""
    if via not in SHIP_VIA:
        raise BadInput("--via", f"{via!r} is not one of {', '.join(SHIP_VIA)}")
    return via


def ship_image_everywhere(cfg: Config, nodes: dict[str, Node], source: str | None = None, *,
                          say: Reporter | None = None, progress: Progress | None = None,
                          via: str = "stream") -> ShipResult:
    """Copy image.ref from ``source`` (default: the head) to every other node, in parallel, node to node,
    sending each only the layers it lacks (0 bytes where it already has the same image): streamed from the
    source's ``docker save`` (``via="stream"``) or pulled from a temporary registry on it (``"registry"``).
    ``progress`` gets (node, bytes so far, layer bytes it lacks, seconds); without it, ``say`` gets lines.

    RemoteFailure when ``source`` lacks the image; NodeError when a target lacks disk or a load fails."""
    src = ship_source(cfg, source)
    ref = cfg.image.ref
    found = image_identity(nodes[src], ref)
    if found is None:
        raise RemoteFailure(f"{src}: image", f"{ref} is not on {src}; nothing to ship")
    targets = [nodes[n.name] for n in cfg.nodes if n.name != src]
    source_ip = next(n.fabric_ip for n in cfg.nodes if n.name == src)
    last: dict[str, int] = {}

    def lines(node: str, sent: int, total: int, seconds: float) -> None:
        if say is not None and sent != last.get(node):
            last[node] = sent
            say(f"{src} → {node}: {sent / 1e6:.1f} MB, {sent / 1e6 / max(seconds, 1e-6):.1f} MB/s")

    ship = ship_via_registry if ship_via(via) == "registry" else ship_layers
    if say is not None and targets:
        say(f"shipping {ref} from {src} to {', '.join(t.name for t in targets)} "
            + ("through a temporary registry on " + src if via == "registry" else "(only the layers each lacks)"))
    shipped = ship(nodes[src], targets, ref, source_ip=source_ip, progress=progress or lines) if targets else {}
    return ShipResult(ref, src, found[1], shipped)
