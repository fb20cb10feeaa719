"""What the gates judge against: the expectations a config implies, and the facts only a live stack gives.

The live side (``sparkserve.deploy.gates_live``) builds a :class:`SmokeResult` from the smoke cell and a
:class:`NodeIdentity` per node; ``gates --from-log`` has neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkserve.plan.dialects import Dialect, SignatureLine, dialect_for

if TYPE_CHECKING:
    from sparkserve.config import Config


@dataclass(frozen=True)
class Expectations:
    """What the configuration says the logs must show."""

    ranks: tuple[str, ...]
    cudagraph_mode: str | None = "FULL_AND_PIECEWISE"
    enforce_eager: bool = False
    pool_tokens: int | None = None  # config gates.pool_tokens
    banked_pool: int | None = None  # journal, for this config fingerprint
    mask_file: bool | None = None  # the drafter directory holds mask_embedding.pt (None: not known)
    mask_token_id: int | None = None
    smoke_prompts: int | None = None
    runner: str = "v2"
    nodes: tuple[str, ...] | None = None  # every node must have a log (None: not checked)
    node_ranks: Mapping[str, tuple[str, ...]] | None = None  # mp: node → ranks it hosts (by node rank × GPUs)
    # the lines every rank must print to prove the profile's path: the image's engine dialect's (none: nothing
    # required), ``{drafter_layers}`` filled with the drafter's layer count (None: not read, not compared)
    signature: tuple[SignatureLine, ...] = ()
    signature_source: str = ""
    drafter_layers: int | None = None

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        *,
        banked_pool: int | None = None,
        mask_file: bool | None = None,
        check_nodes: bool = True,
        drafter_layers: int | None = None,
        dialect: Dialect | None = None,
    ) -> Expectations:
        world = cfg.serve.tensor_parallel_size
        d = dialect or dialect_for(cfg)
        return cls(
            ranks=tuple(str(r) for r in range(world)),
            cudagraph_mode=cfg.serve.compilation.cudagraph_mode.value,
            enforce_eager=cfg.serve.enforce_eager,
            pool_tokens=cfg.gates.pool_tokens,
            banked_pool=banked_pool,
            mask_file=mask_file,
            mask_token_id=cfg.gates.mask_token_id,
            smoke_prompts=cfg.gates.smoke.prompts,
            nodes=tuple(n.name for n in cfg.nodes) if check_nodes else None,
            node_ranks=_node_ranks(cfg),
            # mtp: no drafter, so no drafter-group line (a line naming the drafter's layers) is required
            signature=tuple(s for s in d.signature
                            if cfg.speculative.method != "mtp" or "{drafter_layers}" not in s.line),
            signature_source=f"vLLM {d.vllm_version} ({d.source})",
            drafter_layers=drafter_layers,
        )


def _node_ranks(cfg: Config) -> dict[str, tuple[str, ...]] | None:
    """With the mp executor node i (head = 0) hosts global ranks i·g … i·g+g−1; Ray gathers every rank's
    output on the head, so no node→rank mapping holds there."""
    if cfg.serve.executor != "mp":
        return None
    out: dict[str, tuple[str, ...]] = {}
    first = 0
    for n in cfg.nodes:
        out[n.name] = tuple(str(r) for r in range(first, first + n.gpus))
        first += n.gpus
    return out


@dataclass(frozen=True)
class SmokeError:
    """One failed or hung smoke request, and the node it is blamed on."""

    node: str | None  # the node a hang or stream error is blamed on, when known
    text: str


@dataclass(frozen=True)
class SmokeResult:
    """The smoke cell's outcome (every request has a deadline: a hang is a stream error)."""

    requests: int
    requests_ok: int
    stream_errors: int
    incomplete: int
    errors: tuple[SmokeError, ...] = ()
    node: str | None = None  # where the API server answered (the head)
    stalled_s: float | None = None  # the wedge probe received nothing for this long (measure/wedge.py)


@dataclass(frozen=True)
class NodeIdentity:
    """What runs on one node: its engine image ID and the digest of its drafter directory (None: not read)."""

    image_id: str | None
    drafter_digest: str | None

