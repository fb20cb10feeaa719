"""`up`'s pre-flight: every read-only question before anything starts, and the last look just before the ranks do.

    found = preflight(cfg, nodes, validate=True, copy_drafter=False, say=say)  # checks, image, ranks, drafter
    learn_dialect(cfg, nodes, found.image_id, say)   # an image nothing is known about: its dialect read once
    check_requires(cfg, nodes, found.image_id, say)  # vLLM's declared dependencies: exit 2 when one is missing
    make_cache_dirs(cfg, nodes, plan)                # the image's cache dirs under the cache root
    hosts = memory_before_start(cfg, nodes, say)     # drop the page cache, then free memory against GMU

The node checks are :func:`sparkserve.deploy.doctor.check_all` (`doctor` runs the same), the engine identity is
:mod:`sparkserve.image.on_nodes`; what fails refuses the run here, naming the node, before any container starts.
The cheap answers are judged first and the slow ones are not waited for when those refuse (issue 45: on a real
engine a taken port was said after 28.8 s of engine identity and drafter sync): the inputs, then the node checks
(one probe per node) — a drafter missing where there is no copy to sync from, a taken port or a GPU already full
on a node that holds no sparkserve rank (:func:`raise_early`) — then the engine identity and the drafter.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sparkserve.config import Config, NodeConfig
from sparkserve.deploy.doctor import Check, check_all
from sparkserve.deploy.drafter import DrafterSync, all_cached, sync_drafter
from sparkserve.deploy.inputs import validate_inputs
from sparkserve.deploy.probe import probe_node
from sparkserve.deploy.stack import managed_on_all
from sparkserve.deploy.sync import RemoteState
from sparkserve.deploy.teardown import Reporter
from sparkserve.deploy.timings import span, timed
from sparkserve.errors import BadInput, CheckRefused, RemoteFailure, SparkserveError
from sparkserve.image.on_nodes import ensure_same_engine
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ManagedContainer
from sparkserve.nodes.hostfacts import (
    HostFacts,
    gpu_indices,
    host_question,
    meminfo_bytes,
    memory_verdict,
    sudoers_fix,
)
from sparkserve.nodes.parallel import after, on_all
from sparkserve.plan.build import Plan, build_plan, cache_dirs
from sparkserve.plan.dialects import shipped_for_image, stored_facts
from sparkserve.plan.fabric import FabricFacts
from sparkserve.plan.mounts import CACHE_MOUNT
from sparkserve.units import human_bytes


@dataclass
class Found:
    """What the preflight learned: every node's checks and fabric facts, the one image ID, the managed
    containers already there, and the drafter every node holds."""

    checks: list[Check]
    fabric: dict[str, FabricFacts]
    image_id: str
    existing: dict[str, list[ManagedContainer]]
    drafter: DrafterSync
    hosts: dict[str, HostFacts] = field(default_factory=dict)  # after the page-cache drop, just before the start


def learn_dialect(cfg: Config, nodes: dict[str, Node], image_id: str, say: Reporter) -> None:
    """An image nothing is known about (no override, no stored facts of this image ID, not in the shipped table):
    read its engine dialect from inside it on the head, once — the same reader `image verify` runs. Best effort:
    when it cannot be read, the shipped table / vLLM 0.33.0 apply, as before."""
    if cfg.serve.vllm_version or shipped_for_image(cfg.image.ref) is not None:
        return
    entry = (stored_facts().get("by_ref") or {}).get(cfg.image.ref)
    if isinstance(entry, dict) and entry.get("image_id") == image_id:
        return
    from sparkserve.image.dialect import verify_dialect

    try:
        d, raw = verify_dialect(nodes[cfg.head.name], cfg.image.ref, image_id)
    except SparkserveError as e:
        say(f"warning: image: its engine dialect could not be read ({e.what}); vLLM 0.33.0's flag names apply")
        return
    say(f"image: engine dialect {d.describe() if d else 'unknown (vLLM 0.33.0 applies)'}, read from "
        f"{cfg.image.ref} ({raw.get('how') or 'nothing'})")


def check_requires(cfg: Config, nodes: dict[str, Node], engine_id: str, say: Reporter) -> None:
    """Every distribution the engine's vLLM requires is installed where it runs (:mod:`sparkserve.image.requires`):
    BadInput (exit 2, before any rank starts) naming the missing ones — without them the boot dies at import,
    after the whole load. docker: the answer kept for this image ID (image verify, the dialect read) or read
    once in the image on the head; process: asked of serve.vllm's interpreter every time (nothing said when
    that is not a Python console script). Versions outside vLLM's pins are a warning, said when first read."""
    from sparkserve.image.requires import engine_requires

    docker = cfg.runtime == "docker"
    try:
        found, kept = engine_requires(cfg, nodes, engine_id)
    except SparkserveError as e:
        if docker:
            say(f"warning: image: vLLM's declared dependencies could not be checked ({e.what})")
        return
    if found is None or found.vllm is None:  # no vllm distribution there (an emulator, a source tree)
        return
    line = found.missing_line("in the image" if docker else "where serve.vllm runs")
    if line:
        raise BadInput("image.ref" if docker else "serve.vllm", line)
    if not kept and found.mismatch_line():
        say(f"warning: {found.mismatch_line()}")


def make_cache_dirs(cfg: Config, nodes: dict[str, Node], plan: Plan) -> None:
    """The image's cache dirs on every node (docker bind mounts need their sources), under the cache root the
    preflight made. RemoteFailure naming the node that refuses."""
    dirs = cache_dirs(plan)

    def make(name: str) -> None:
        for d in dirs.get(name, []):
            try:
                nodes[name].makedirs(d)
            except OSError as e:
                raise RemoteFailure(f"{name}: cache", f"cannot create {d}: {e.strerror or e} (container.cache_root)",
                                    node=name, step="cache") from None

    if any(dirs.values()):
        on_all([n.name for n in cfg.nodes], make)


def preflight(cfg: Config, nodes: dict[str, Node], *, validate: bool, copy_drafter: bool,
               say: Reporter) -> Found:
    """Every read-only question at once, each node in parallel: input validation, node checks (one round
    trip: paths, disk, ports, memory, fabric facts, the drafter's manifest from the node's cache when there
    is nothing to copy, and the containers' writable mount dirs made), image identity, the running
    containers. Failures are then reported in that order; a drafter to copy is copied only once every check
    passed."""
    say("preflight: checking every node")
    fabric: dict[str, FabricFacts] = {}
    # the drafter's manifest from each node's cache reads no weights, so the node probe answers it too
    # (before validation: one python3 start per node for every check); a cache miss is read in full after
    cached: dict[str, RemoteState | None] | None = None if copy_drafter else {}
    # the cache root is made (and so proven writable) here; the image's own dirs under it once its ID is known
    rw = {s.node: [m.source.rsplit("/", 1)[0] for m in s.mounts if m.target == CACHE_MOUNT]
          for s in build_plan(cfg).specs}
    hosts: dict[str, HostFacts] = {}
    ranks: dict[str, int] = {}
    pool = ThreadPoolExecutor(max_workers=6)
    done = False
    try:
        f_valid = pool.submit(timed("preflight: validate", validate_inputs), cfg, nodes) if validate else None
        f_checks = pool.submit(timed("preflight: node checks", check_all), cfg, nodes, None, check_ports=True,
                               mkdirs=rw, fabric_out=fabric, manifest_out=cached, lean=True, host_out=hosts,
                               ranks_out=ranks)
        f_image = pool.submit(timed("preflight: engine identity", ensure_same_engine), cfg,
                              [nodes[n.name] for n in cfg.nodes])
        # docker: after the image question, so each node's questions share one connection (each more
        # connection starts another `docker system dial-stdio` on the node)
        f_existing = pool.submit(timed("preflight: running ranks", after), f_image if cfg.runtime == "docker" else None,
                                 managed_on_all, nodes, cfg)
        # the cheap answers are judged first (milliseconds: the config, one probe per node); what costs seconds
        # (the engine's identity, the drafter's sync) is not waited for when one of them refuses the run
        if f_valid is not None:
            f_valid.result()  # BadInput (exit 2): nothing was started
        checks = f_checks.result()
        raise_failed_checks(checks)
        raise_early(cfg, checks, hosts, ranks)
        for c in checks:  # the host's known GB10 hazards, each with its fix: said, not refused
            if c.status == "warn" and c.name in HOST_WARNINGS:
                say(f"warning: {c.node}: {c.name}: {c.detail}")
        image_id = f_image.result()
        say(f"image: {cfg.image.ref} is {image_id[:19]} on every node" if cfg.runtime == "docker" else
            f"engine: serve.vllm {cfg.serve.vllm} is {image_id[:19]} on every node")
        existing = f_existing.result()
        done = True
    finally:  # a refusal does not wait for the slow questions still under way (their connections close with it)
        pool.shutdown(wait=done, cancel_futures=not done)
    # Hashing the drafter on a node whose cache missed comes after validation: a wrong drafter must not cost
    # a full read of its weights before its exit 2.
    with span("preflight: drafter"):
        drafter = sync_drafter(cfg, nodes, say, None if cached is None else all_cached(cfg, cached))
    return Found(checks, fabric, image_id, existing, drafter)


#: Host checks whose warnings `up` says before it boots (nodes.hostfacts.host_verdicts).
HOST_WARNINGS = ("iommu", "swappiness", "earlyoom", "shm", "nccl", "kernel parity", "driver parity",
                 "firmware parity", "nccl parity")
#: Failed checks that refuse the run although every node answered (exit 1, CheckRefused), in the order judged.
REFUSING = ("kernel", "target manifest", "memory")


def raise_failed_checks(checks: list[Check]) -> None:
    """The first failed node check as the error, the others as its details. Busy ports are judged later:
    the stack being replaced may be what holds them. Free memory is judged by :func:`memory_before_start`, just
    before the ranks start."""
    bad = [c for c in checks if c.status == "fail" and not c.name.startswith("port ")
           and c.name not in REFUSING]
    if bad:
        c = bad[0]
        raise RemoteFailure(f"{c.node}: preflight {c.name}", c.detail, node=c.node, step=f"preflight {c.name}",
                            details=[f"{x.node}: {x.name}: {x.detail}" for x in bad[1:]])
    raise_refusals(checks, ("kernel", "target manifest"))


def raise_early(cfg: Config, checks: list[Check], hosts: dict[str, HostFacts], ranks: dict[str, int]) -> None:
    """What the node checks already prove, refused before any slow step: a busy port, or too little accelerator
    memory even with the page cache dropped, on a node that holds no sparkserve rank (so nothing `up` would stop
    can be what holds it). A node holding ranks is judged later, after they are stopped."""
    idle = {n for n, count in ranks.items() if count == 0}
    busy = [c for c in checks if c.name.startswith("port ") and c.status == "fail" and c.node in idle]
    if busy:
        c = busy[0]
        raise RemoteFailure(f"{c.node}: preflight ports", c.detail, node=c.node, step="preflight ports",
                            details=[f"{x.node}: {x.name}: {x.detail}" for x in busy[1:]])
    full = [x for n in cfg.nodes if n.name in idle and n.name in hosts
            if (x := memory_full(cfg, n, hosts[n.name])) is not None]
    raise_refusals(full, ("memory",))


def memory_full(cfg: Config, node_cfg: NodeConfig, f: HostFacts) -> Check | None:
    """A failed "memory" check when the node's accelerator memory is short even counting all it could free by
    dropping the page cache (MemAvailable on unified memory; the driver's free memory on a discrete GPU): another
    process holds it, and vLLM would refuse to start. None when it may suffice (judged again just before the
    start, after the drop) or is unknown."""
    mem = f.memory(gpu_indices(cfg, node_cfg))
    if mem is None:
        return None
    gmu = cfg.serve.gpu_memory_utilization
    need = int(gmu * mem.total)
    have = (meminfo_bytes(f.meminfo, "MemAvailable") or mem.free) if mem.unified else mem.free
    if have >= need:
        return None
    kind = "unified memory available (MemAvailable: free + page cache)" if mem.unified else "free GPU memory"
    return Check(node_cfg.name, "memory", "fail",
                 f"{kind} {human_bytes(have)} is below gpu_memory_utilization {gmu} x {human_bytes(mem.total)} = "
                 f"{human_bytes(need)}, even with the page cache dropped: vLLM would refuse to start — free memory "
                 f"on {node_cfg.name} (another process holds it) or lower serve.gpu_memory_utilization")


def raise_refusals(checks: list[Check], names: tuple[str, ...]) -> None:
    """The first failed check among ``names`` as a CheckRefused (exit 1), the others as its details."""
    bad = [c for c in checks if c.status == "fail" and c.name in names]
    if bad:
        c = bad[0]
        raise CheckRefused(f"{c.node}: preflight {c.name}", c.detail, node=c.node, step=f"preflight {c.name}",
                           details=[f"{x.node}: {x.name}: {x.detail}" for x in bad[1:]])


def memory_before_start(cfg: Config, nodes: dict[str, Node], say: Reporter) -> dict[str, HostFacts]:
    """Just before the ranks start, on every node at once: sync, drop the page cache and compact (``sudo -n``;
    watchdog.drop_caches), then free accelerator memory against gpu_memory_utilization x total — MemFree on
    unified memory, the driver's free memory on a discrete GPU. CheckRefused (exit 1) naming the node when it
    falls short: vLLM would refuse it minutes later. Returns each node's host facts (the watchdog's and the
    journal's)."""
    drop = cfg.watchdog.drop_caches
    by_name = {n.name: n for n in cfg.nodes}
    facts = on_all([nodes[n.name] for n in cfg.nodes],
                   lambda node: HostFacts.from_answer(probe_node(node, host=host_question(cfg, drop=drop)).host or {}),
                   name=lambda node: node.name)
    checks = [Check(name, check, status, detail) for name, f in facts.items()
              for check, status, detail in memory_verdict(cfg, by_name[name], f, dropped=drop)]
    kv = next((c for c in checks if c.name == "kv_cache" and c.status == "fail"), None)
    if kv is not None:  # an absurd serve.kv_cache_memory_bytes is bad input (exit 2), found before any rank starts
        raise BadInput("serve.kv_cache_memory_bytes", kv.detail.removeprefix("serve.kv_cache_memory_bytes "))
    raise_refusals(checks, ("memory",))
    for name, f in facts.items():
        mem = f.memory([])
        if f.drop and mem is not None and mem.unified:
            say(f"warning: {name}: the page cache was not dropped before the boot ({f.drop}) — "
                f"{sudoers_fix(by_name[name].user, str(cfg.host.proc_root))}")
    return facts
