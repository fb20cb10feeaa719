"""`swap-drafter PATH`: a new drafter without an image rebuild, with rollback.

1. validate PATH against the running config (K rule, mask file, taps, hidden size, …) — nothing is
   touched if it is wrong;
2. sync it to every node next to the current drafter, at ``<parent>/<name>-<digest12>`` (the running
   stack keeps its own bind mount untouched);
3. replace the stack with the new bind mount and run the gates;
4. if anything fails, bring the drafter that was *serving* back up (read from the running containers'
   bind mount before the swap: after an earlier swap it is not the config file's; its bytes never moved)
   and say so. When that fails too, nothing runs: :class:`RollbackFailed`, its own exit code (4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkserve.config import Config
from sparkserve.deploy.inputs import validate_inputs
from sparkserve.deploy.stack import managed_on_all
from sparkserve.deploy.sync import remote_manifest
from sparkserve.deploy.teardown import Reporter, interrupted
from sparkserve.deploy.up import up
from sparkserve.errors import BadInput, SparkserveError
from sparkserve.journal import lookup
from sparkserve.models.manifest import manifest
from sparkserve.nodes.base import Node
from sparkserve.nodes.runtime import engine_for, serving_drafter
from sparkserve.observe.gate_report import GateReport


@dataclass
class SwapResult:
    """How a swap ended: swapped (``ok``), rolled back to the previous drafter, or neither (nothing runs).

    ``message`` is the one line for people; the other fields are set as the outcome has them."""

    ok: bool
    rolled_back: bool
    message: str
    error: str | None = None  # why the swap failed
    details: list[str] = field(default_factory=list)
    rollback_error: str | None = None  # why the rollback failed too
    drafter_path: str | None = None  # swapped: where the new drafter is on every node
    drafter_digest: str | None = None
    deployment: str | None = None  # the fingerprint now running (swapped or rolled back)
    gates: GateReport | None = None
    unchanged: bool = False  # the drafter asked for already serves: nothing was restarted

    def to_json(self) -> dict[str, Any]:
        """The `swap-drafter --json` object: its keys depend on the outcome."""
        head: dict[str, Any] = {"ok": self.ok, "rolled_back": self.rolled_back}
        if self.ok:
            return head | {"unchanged": self.unchanged, "drafter_path": self.drafter_path,
                           "drafter_digest": self.drafter_digest, "deployment": self.deployment,
                           "gates": self.gates.to_json() if self.gates is not None else None,
                           "message": self.message}
        if self.rolled_back:
            return head | {"error": self.error, "details": self.details, "deployment": self.deployment,
                           "message": self.message}
        return head | {"error": self.error, "rollback_error": self.rollback_error, "message": self.message}


def swapped_config(cfg: Config, new_dir: Path, digest: str) -> Config:
    """``cfg`` with the drafter at its new node path (next to the current one), synced from ``new_dir``."""
    new = cfg.model_copy(deep=True)
    node_path = Path(str(cfg.drafter.path)).parent / f"{new_dir.name}-{digest[:12]}"
    new.drafter = new.drafter.model_copy(update={"path": node_path, "source": new_dir})
    return new


def serving_config(cfg: Config, nodes: dict[str, Node]) -> Config:
    """``cfg`` with the drafter the running stack serves (its head's drafter bind mount, or with runtime
    process the drafter its argv names), which is what a rollback must return to; ``cfg`` itself when
    nothing runs or it serves the configured drafter."""
    head_node = {cfg.head.name: nodes[cfg.head.name]}
    head = [c for c in managed_on_all(head_node, cfg).get(cfg.head.name, []) if c.running]
    if not head:
        return cfg
    mounted = serving_drafter(engine_for(nodes[cfg.head.name], cfg), head[0].id)
    if mounted is None or Path(mounted) == Path(str(cfg.drafter.path)):
        return cfg
    # the bytes are already on every node (they serve): no source to copy from
    return cfg.model_copy(update={"drafter": cfg.drafter.model_copy(update={"path": Path(mounted), "source": None})})


def swap_drafter(cfg: Config, nodes: dict[str, Node], path: Path, *, break_lock: bool = False,
                 say: Reporter = print, run_gates: bool = True) -> SwapResult:
    """Swap the running stack's drafter for the one at ``path`` (see the module docstring).

    BadInput (nothing changed) when ``path`` is not a valid drafter for this config; otherwise the outcome
    is in the result, rollback included."""
    if cfg.drafter is None or cfg.speculative.method == "mtp":
        raise BadInput("speculative.method", "mtp serves the target's built-in head: there is no drafter to swap "
                       "(a DFlash profile, e.g. `profile: g4-262k`, serves one)")
    new_dir = path.expanduser().resolve()
    if not new_dir.exists():
        raise BadInput(str(path), "does not exist" + _near(path.expanduser()))
    if not new_dir.is_dir():
        raise BadInput(str(path), "is not a directory (a drafter is a directory: config.json, weights, "
                       "mask_embedding.pt)")
    # The cheap checks first (headers, config, mask file): a wrong drafter is refused before its weights are hashed.
    validate_inputs(cfg.model_copy(update={"drafter": cfg.drafter.model_copy(update={"source": new_dir})}), nodes)
    digest = manifest(new_dir).digest
    new_cfg = swapped_config(cfg, new_dir, digest)
    prev = serving_config(cfg, nodes)
    now = _serving_now(cfg, nodes)
    if now is not None and now[2] == digest:
        return SwapResult(True, False, f"nothing to do: {new_dir} ({digest[:12]}) is the drafter serving now "
                          f"(at {now[0]}); nothing was restarted", drafter_path=now[0], drafter_digest=digest,
                          deployment=now[1], unchanged=True)
    say(f"swap: new drafter {new_dir} ({digest[:12]}) → {new_cfg.drafter.path} on every node")
    try:
        res = up(new_cfg, nodes, run_gates=run_gates, validate=False, break_lock=break_lock, say=say)
    except SparkserveError as e:
        if interrupted(e):  # the operator asked to stop: no rollback boots anything (up cleaned up after itself)
            raise
        say(f"swap failed ({e.line()}); rolling back to {prev.drafter.path}")
        try:
            # the previous config booted before: its inputs were validated then
            back = up(prev, nodes, run_gates=run_gates, validate=False, say=say)
        except SparkserveError as e2:
            return SwapResult(False, False, f"ROLLBACK FAILED — nothing runs: swap failed: {e.line()}; rollback to "
                              f"{prev.drafter.path} failed: {e2.line()}", error=e.line(), rollback_error=e2.line())
        return SwapResult(False, True, f"swap failed: {e.line()}; rolled back to {prev.drafter.path} "
                          f"({back.api_url} serving again)", error=e.line(), details=e.details,
                          deployment=back.fingerprint)
    return SwapResult(True, False, f"swapped: {res.served_name} now drafts with {new_dir.name} ({digest[:12]}) at "
                      f"{res.api_url}; set drafter.path: {new_cfg.drafter.path} and drafter.source: {new_dir} in "
                      "your config to keep it", drafter_path=str(new_cfg.drafter.path), drafter_digest=digest,
                      deployment=res.fingerprint, gates=res.gates)


def _serving_now(cfg: Config, nodes: dict[str, Node]) -> tuple[str, str, str | None] | None:
    """The running head's drafter: (its path on the nodes, the deployment, its manifest digest — from the
    journal's record of that deployment, else read on the head); None when no head rank runs."""
    head = [c for c in managed_on_all({cfg.head.name: nodes[cfg.head.name]}, cfg).get(cfg.head.name, [])
            if c.running]
    if not head:
        return None
    c = head[0]
    path = serving_drafter(engine_for(nodes[cfg.head.name], cfg), c.id)
    if path is None:
        return None
    rec = lookup(lambda j: j.deployment(c.fingerprint), None) if c.fingerprint else None
    digest = rec.get("drafter_digest") if rec else None
    if digest is None:
        try:
            state = remote_manifest(nodes[cfg.head.name], path, cached_only=True)
            digest = state.manifest.digest if state.exists and not state.uncached else None
        except SparkserveError:
            digest = None
    return path, c.fingerprint, digest


def _near(path: Path) -> str:
    """"; did you mean X?" for a directory next to ``path`` whose name is close to it."""
    import difflib

    parent = path.parent if str(path.parent) else Path(".")
    try:
        names = [p.name for p in parent.iterdir() if p.is_dir()]
    except OSError:
        return ""
    near = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean {parent / near[0]}?" if near else ""
