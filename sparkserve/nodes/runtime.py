"""The runtime seam: how a rank runs on a node — in a container (``runtime: docker``) or as a host process
(``runtime: process``). Everything above (deploy/) holds a :class:`Runtime` and never asks which.

    eng = engine_for(node, cfg)          # or engine_for(node, plan): Engine (docker) or ProcessEngine
    rid = eng.run(spec)                  # a handle: container id, or a process rank id
    eng.state(rid).running; eng.logs(rid, tail=40); eng.stop_and_remove(rid, timeout=30)
    (is the engine the same on every node: sparkserve.image.on_nodes.ensure_same_engine)

Implementations: :class:`sparkserve.nodes.engine.Engine` (docker SDK) and
:class:`sparkserve.nodes.processes.ProcessEngine` (one stdlib program on the node).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ContainerState, Engine, ExecResult, ManagedContainer
from sparkserve.nodes.processes import LABEL_ENGINE_ID, ProcessEngine
from sparkserve.plan.build import Plan
from sparkserve.plan.container import ContainerSpec
from sparkserve.plan.mounts import DRAFTER_MOUNT
from sparkserve.plan.serve_argv import drafter_in_argv

if TYPE_CHECKING:
    from sparkserve.config import Config

__all__ = ["LABEL_ENGINE_ID", "Runtime", "engine_for", "serving_drafter"]


class Runtime(Protocol):
    """The verbs deploy/ uses on one node's ranks (a rank is named by the handle ``run`` returned)."""

    node: Node
    noun: str  # what a rank is on this runtime, for messages: "container" or "process"

    @property
    def name(self) -> str: ...

    def run(self, spec: ContainerSpec, *, make_dirs: bool = True) -> str: ...

    def list_managed(self, *, include_stopped: bool = True) -> list[ManagedContainer]: ...

    def managed(self, ref: str) -> ManagedContainer | None: ...

    def state(self, ref: str | ManagedContainer) -> ContainerState: ...

    def daemon_answers(self, *, watch_s: float = 0.0, every_s: float = 0.25) -> bool: ...

    def restarted_since(self, ref: str | ManagedContainer, started_at: str) -> bool: ...

    def logs(self, ref: str | ManagedContainer, *, since: datetime | float | int | None = None,
             follow: bool = False, tail: int | None = None, timestamps: bool = False) -> Iterator[str]: ...

    def log_tail(self, ref: str | ManagedContainer, n: int = 40) -> list[str]: ...

    def stop_and_remove(self, ref: str | ManagedContainer, *, timeout: int) -> None: ...

    def exec(self, ref: str | ManagedContainer, argv: list[str], *, detach: bool = False,
             to_container_log: bool = False, env: dict[str, str] | None = None) -> ExecResult: ...

    def inspect_spec(self, ref: str | ManagedContainer) -> tuple[ContainerSpec, str]: ...

    def parity_facts(self, ref: str | ManagedContainer) -> dict[str, object]: ...


def engine_for(node: Node, how: Config | Plan | None = None) -> Runtime:
    """The runtime ``how`` (a config or a plan; None: docker) names, on ``node``."""
    if how is None:
        return Engine(node)
    if isinstance(how, Plan):
        runtime, run_dir, vllm = how.runtime, how.run_dir, how.vllm
    else:
        runtime, run_dir, vllm = how.runtime, how.process.run_dir, how.serve.vllm
    if runtime == "process":
        return ProcessEngine(node, run_dir=run_dir, vllm=vllm)
    return Engine(node)


def serving_drafter(eng: Runtime, ref: str) -> str | None:
    """The drafter a running rank serves: the source of its drafter bind mount (docker) or the
    ``--speculative-config`` model of its argv (process)."""
    spec, _ = eng.inspect_spec(ref)
    mounted = next((m.source for m in spec.mounts if m.target == DRAFTER_MOUNT), None)
    return mounted if mounted is not None else drafter_in_argv(spec.serve_argv())
