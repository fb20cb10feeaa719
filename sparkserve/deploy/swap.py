"""`swap-drafter PATH`: a new drafter without an image rebuild, with rollback.

1. validate PATH against the running config (K rule, mask file, taps, hidden size, …) — nothing is
   touched if it is wrong;
2. sync it to every node next to the current drafter, at ``<parent>/<name>-<digest12>`` (the running
   stack keeps its own bind mount untouched);
3. replace the stack with the new bind mount and run the gates;
4. if anything fails, bring the previous drafter back up (its bytes never moved) and say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkserve.config import Config
from sparkserve.deploy import lifecycle
from sparkserve.errors import BadInput, SparkserveError
from sparkserve.models.manifest import manifest
from sparkserve.nodes.factory import open_nodes


def swapped_config(cfg: Config, new_dir: Path, digest: str) -> Config:
    new = cfg.model_copy(deep=True)
    node_path = Path(str(cfg.drafter.path)).parent / f"{new_dir.name}-{digest[:12]}"
    new.drafter = new.drafter.model_copy(update={"path": node_path, "source": new_dir})
    return new


def swap_drafter(cfg: Config, path: Path, *, break_lock: bool = False, say: lifecycle.Reporter = print,
                 run_gates: bool = True) -> dict[str, Any]:
    new_dir = path.expanduser().resolve()
    if not new_dir.is_dir():
        raise BadInput(str(path), "not a directory")
    from sparkserve.deploy.gates_live import gates_for_up

    digest = manifest(new_dir).digest
    new_cfg = swapped_config(cfg, new_dir, digest)
    gate_runner = gates_for_up if run_gates else None
    with open_nodes(cfg) as nodes:
        lifecycle.validate_inputs(new_cfg, nodes)  # BadInput (exit 2) before anything changes
        say(f"swap: new drafter {new_dir} ({digest[:12]}) → {new_cfg.drafter.path} on every node")
        try:
            res = lifecycle.up(new_cfg, nodes, run_gates=run_gates, break_lock=break_lock, say=say,
                               gate_runner=gate_runner)
        except SparkserveError as e:
            say(f"swap failed ({e.line()}); rolling back to {cfg.drafter.path}")
            try:
                back = lifecycle.up(cfg, nodes, run_gates=run_gates, say=say, gate_runner=gate_runner)
            except SparkserveError as e2:
                return {"ok": False, "rolled_back": False, "error": e.line(), "rollback_error": e2.line(),
                        "message": f"swap failed: {e.line()}; ROLLBACK FAILED too: {e2.line()} — nothing runs"}
            return {"ok": False, "rolled_back": True, "error": e.line(), "details": e.details,
                    "deployment": back.fingerprint,
                    "message": f"swap failed: {e.line()}; rolled back to {cfg.drafter.path} "
                               f"({back.api_url} serving again)"}
    return {"ok": True, "rolled_back": False, "drafter_path": str(new_cfg.drafter.path), "drafter_digest": digest,
            "deployment": res.fingerprint, "gates": res.gates,
            "message": f"swapped: {res.served_name} now drafts with {new_dir.name} ({digest[:12]}) at {res.api_url}; "
                       f"set drafter.path: {new_cfg.drafter.path} and drafter.source: {new_dir} in your config "
                       "to keep it"}
