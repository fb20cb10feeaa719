"""Watch a booting stack on every node until it is where `up` needs it, or say exactly why it never will.

This is the one module that waits. :func:`wait_ready` waits until the head serves; :func:`wait_running` looks once
at just-started ranks (ray: the head runs before its workers join). Both look the same way (:func:`_poll_node` on
every watched rank in parallel, every ``POLL_S``): the rank's container still runs, its log lines (boot phase, fatal
lines), free unified memory against the watchdog floor; the earliest failure is the cause. For readiness the head's
``/v1/models`` must list the served model: real vLLM answers /health 200 while a dead follower hung every request.
"""
from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from sparkserve import interrupts
from sparkserve.config import API_KEY_ENV, Config
from sparkserve.deploy.watchdog import Floors, Phase, phase_of_line
from sparkserve.errors import RemoteFailure, SparkserveError
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.engine import ContainerState, NoSuchContainer
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.runtime import Runtime, engine_for
from sparkserve.observe.logpatterns import FATAL, PEER_LOST
from sparkserve.plan.build import Plan


@dataclass
class NodeView:
    node: str
    rank: int
    container: str
    phase: Phase = Phase.START
    last_line: str = ""
    lines_seen: int = 0
    available: int | None = None
    fatal: str | None = None
    log: list[str] = field(default_factory=list)
    stamps: list[str] = field(default_factory=list)  # docker's timestamp of each line of ``log``
    failure: BootFailure | None = None
    failed_at: float | None = None  # unix time of the failure (first fatal line, container exit)
    when: str = "during the boot"  # the watch's phase, as a failure of the node's docker names it


class BootFailure(RemoteFailure):
    """The boot cannot succeed: which node, which step, and the log lines that say why."""

    def __init__(self, node: str, step: str, what: str, lines: list[str]) -> None:
        super().__init__(f"{node}: {step}", what, node=node, step=step, details=lines)


def served_models(url: str, timeout: float = 2.0, *, api_key: str | None = None,
                  via: SplitResult | None | Literal["env"] = "env") -> list[str] | None:
    """Model ids from ``GET /v1/models``, or None when the server does not answer (yet). ``api_key``: the
    server's key (``serve.api_key_*``), sent as a bearer token; without it a keyed server answers 401.

    The standard library's client, one connection per call: the readiness wait asks every few
    milliseconds, and a refused connection costs a fraction of a millisecond (an HTTP library's client,
    its TLS context built per call, cost 20-40 ms of CPU each time). ``via``: the proxy (None: none), by
    default the one the environment names (:func:`proxy_for`), as the HTTP library honoured it."""
    u = urlsplit(url)
    kind = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    target = f"{u.path.rstrip('/')}/v1/models"
    proxy = proxy_for(url) if via == "env" else via
    if proxy is None:
        conn = kind(u.hostname or "localhost", u.port, timeout=timeout)
    else:  # the proxy is asked for the whole URL (or, for https, to tunnel to it)
        conn = kind(proxy.hostname or "localhost", proxy.port, timeout=timeout)
        if u.scheme == "https":
            conn.set_tunnel(u.hostname or "localhost", u.port)
        else:
            target = f"{url.rstrip('/')}/v1/models"
    try:
        conn.request("GET", target, headers=headers)
        r = conn.getresponse()
        if r.status != 200:
            return None
        data = json.loads(r.read())
        return [m.get("id", "") for m in data.get("data", [])]
    except (OSError, http.client.HTTPException, ValueError, AttributeError, TypeError):
        return None
    finally:
        conn.close()


def proxy_for(url: str) -> SplitResult | None:
    """The proxy the environment names for ``url``'s scheme (``http_proxy`` …), unless ``no_proxy`` exempts
    its host."""
    u = urlsplit(url)
    proxy = urllib.request.getproxies_environment().get(u.scheme)
    if not proxy or urllib.request.proxy_bypass_environment(u.hostname or ""):
        return None
    return urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _stamp(text: str) -> float | None:
    """Docker's RFC 3339 log timestamp (``2026-11-29T17:51:01.123456789Z``) → unix seconds."""
    try:
        base, _, frac = text.rstrip("Z").partition(".")
        return datetime.fromisoformat(base + "+00:00").timestamp() + float(f"0.{frac or 0}")
    except ValueError:
        return None


def _poll_node(view: NodeView, eng: Runtime, node: Node, floors: Floors | None) -> None:
    """One look at one rank. A failure is recorded on the view (with when it happened), not raised: when
    several ranks fail in the same poll, the earliest is the cause and the others its consequences."""
    try:  # both reads: the daemon can stop answering between the state and the log (a race seen on the rig)
        st = eng.state(view.container)
        stamped = [ln.partition(" ") for ln in eng.logs(view.container, tail=400, timestamps=True)]
    except NoSuchContainer:
        raise
    except NodeError as e:  # the node's docker daemon (or the link to it) did not answer
        if eng.daemon_answers():
            raise
        _daemon_gone(view, e.what, time.time())
        return
    lines = [text for _, _, text in stamped]
    view.log = lines
    view.stamps = [stamp for stamp, _, _ in stamped]
    fatal_at = None
    for stamp, _, line in stamped:  # phases only move forward, so re-reading the window is harmless
        view.phase = phase_of_line(line, view.phase)
        if FATAL.search(line):
            if view.fatal is None:
                view.fatal = line
            if fatal_at is None:
                fatal_at = _stamp(stamp)
    if lines:
        view.last_line = lines[-1][-160:]
    if not st.running and not eng.daemon_answers(watch_s=_daemon_watch_s(st)):
        _daemon_gone(view, f"rank {view.rank}'s container was stopped with it", _stamp(st.finished_at))
        return
    if stopped_by_signal(st) and eng.restarted_since(view.container, st.started_at):
        _daemon_gone(view, f"it restarted since rank {view.rank}'s container started, and stopped that container",
                     _stamp(st.finished_at))
        return
    if not st.running:
        why = f"exit code {'unknown' if st.exit_code is None else st.exit_code}" + (
            ", OOM-killed" if st.oom_killed else "")
        noun = getattr(eng, "noun", "container")
        cause = next(iter(_root_causes(lines)), None)  # the headline names the cause the log gives
        view.failure = BootFailure(view.node, "boot", f"rank {view.rank} {noun} {view.container[:12]} stopped "
                                   f"({why})" + (f": {headline(cause)}" if cause else ""), explain(lines))
        ended = _stamp(st.finished_at)
        view.failed_at = min(x for x in (fatal_at, ended, time.time()) if x is not None)
        return
    if view.fatal:
        # the headline names the cause: the log reader's first fault (a traceback's exception line with its
        # message), not the `WorkerProc failed to start.` / `EngineCore failed to start.` header above it
        cause = next(iter(_root_causes(lines)), None) or view.fatal
        what = f"rank {view.rank} logged a fatal line: {headline(cause)}"
        view.failure = BootFailure(view.node, "boot", what, explain(lines))
        view.failed_at = fatal_at if fatal_at is not None else time.time()
        return
    if floors is not None:  # MemFree and buddyinfo; a page-cache drop under the soft floor (deploy.watchdog)
        view.available, breach = floors.look(view.node, node, view.phase)
        if breach:
            view.failure = BootFailure(view.node, "memory watchdog", breach.message(), explain(lines))
            view.failed_at = None  # a condition of now, not an event in the log: after any rank's crash


def headline(line: str, width: int = 240) -> str:
    """A log line as a headline: its message from the start (the vLLM ``(Proc pid=N) LEVEL date [file:n]``
    prefix dropped, so ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate …`` leads), clipped at
    the end only."""
    from sparkserve.observe.logline import normalise

    msg = next((r.msg for r in normalise(1, line.strip()) if r.msg.strip()), line)
    return _clip(msg.strip(), width)


# Exit codes of an engine that was told to stop: SIGTERM handled (0) or not (143), or SIGKILL (137: a daemon's
# shutdown after the stop timeout, or containerd going down with a killed dockerd). During a boot or the settle
# window nobody but a failing docker daemon does that, so then the daemon is watched before the exit is believed;
# any other exit is checked with one ping (the daemon is asked before the container is blamed). An OOM kill
# (137 with OOMKilled) is the container's own.
STOPPED_BY_SIGNAL = (0, 137, 143)
DAEMON_WATCH_S = 2.0


def stopped_by_signal(st: ContainerState) -> bool:
    """A stopped container that something told to stop (not an OOM kill): its daemon is asked first."""
    return not st.running and st.exit_code in STOPPED_BY_SIGNAL and not st.oom_killed


def _daemon_watch_s(st: ContainerState) -> float:
    """How long to watch the daemon before believing that a stopped container stopped on its own."""
    return DAEMON_WATCH_S if stopped_by_signal(st) else 0.0


def _daemon_gone(view: NodeView, why: str, at: float | None) -> None:
    """The node's docker daemon stopped answering: a failure of the node, not an exit of the engine. The
    container cannot be asked to stop while the daemon is gone, so the failure names it."""
    what = (f"the node's docker daemon stopped answering {view.when} ({why}); rank {view.rank} container "
            f"{view.container[:12]} may still be on the node — run `sparkserve down` once its docker is back")
    view.failure = BootFailure(view.node, "docker", what, explain(view.log))
    view.failed_at = at if at is not None else time.time()


def _first_failure(views: list[NodeView]) -> BootFailure | None:
    """The failure that happened first (followers before the head on a tie: the head relays theirs);
    the others ride along as details. When the head failed first but a follower that is still running had
    logged a root cause before it (a worker raising inside a collective: the head relays it and exits),
    the failure is that follower's."""
    def key(v: NodeView) -> tuple[bool, float, bool, int]:
        when = round(v.failed_at, 2) if v.failed_at is not None else float("inf")
        return _only_lost_its_peer(v), when, v.failed_at is not None and v.rank == 0, v.rank

    failed = sorted((v for v in views if v.failure is not None), key=key)
    if not failed:
        return None
    first = failed[0].failure
    assert first is not None
    relayed = _cause_on_a_follower(views, failed[0])
    if relayed is not None:
        relayed.details.append(f"then {failed[0].node} (rank {failed[0].rank}) failed: {first.what}")
        first = relayed
    for v in failed[1:]:
        assert v.failure is not None
        first.details.append(f"also failed on {v.node}: {v.failure.what}")
    return first


def _only_lost_its_peer(v: NodeView) -> bool:
    """A rank whose log says only that it lost its peer (every root-cause line is a c10d/Gloo/socket "the
    other side went away" line): a consequence, ordered after any rank that failed of its own cause."""
    causes = _root_causes(v.log)
    return bool(causes) and all(PEER_LOST.search(c) for c in causes)


def _cause_on_a_follower(views: list[NodeView], head: NodeView) -> BootFailure | None:
    """The earliest root-cause line a follower (with no failure of its own yet) logged at or before the
    head's failure, as that follower's failure; None when the head failed first on its own. A line where the
    follower reports losing its peer (c10d ``recvValue failed … Did the remote server shutdown or crash?``, a
    connection reset by the master: :data:`~sparkserve.observe.logpatterns.PEER_LOST`) is a consequence of the
    head's failure, never its cause, whatever the time stamps say (the nodes' clocks and docker's stamps are
    milliseconds apart: the follower's "the head went away" line can land before the head's crash)."""
    if head.rank != 0 or head.failed_at is None:
        return None
    found: list[tuple[float, NodeView, str]] = []
    for v in views:
        if v is head or v.failure is not None:
            continue
        for lineno, text in _root_cause_lines(v.log):
            if PEER_LOST.search(text):
                continue
            at = _stamp(v.stamps[lineno - 1]) if 0 < lineno <= len(v.stamps) else None
            if at is not None and round(at, 2) <= round(head.failed_at, 2):
                found.append((at, v, text))
                break
    if not found:
        return None
    _, v, text = min(found, key=lambda x: (x[0], x[1].rank))
    return BootFailure(v.node, "boot", f"rank {v.rank} failed: {headline(text)}", explain(v.log))


def explain(lines: list[str], n: int = 12) -> list[str]:
    """The lines that explain a failure, at most ``n``: the first fatal line, then the root-cause lines the
    log reader finds (a traceback's ``XxxError: …``, not its frames), then the last lines of the log."""
    lines = [x.rstrip() for x in lines]
    first = next((x for x in lines if FATAL.search(x)), None) or next(
        (x for x in lines if x.startswith("Traceback")), None)
    out: list[str] = [first] if first else []
    for text in _root_causes(lines):
        if text not in out:
            out.append(text)
    out = out[: max(n // 2, 1)]
    tail = [x for x in lines[-(4 if out else n):] if x not in out]
    if out and tail:
        out.append("last lines:")
    return [_clip(x) for x in out + tail]


def _clip(line: str, width: int = 240) -> str:
    """One screen: a 4000-character config dump line is cut, not wrapped over the terminal."""
    return line if len(line) <= width else line[: width - 1] + "…"


def _root_causes(lines: list[str]) -> list[str]:
    """Fault lines (root causes) of a log tail, in order; never raises (an explanation must not fail)."""
    return [text for _, text in _root_cause_lines(lines)]


def _root_cause_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(1-based line number, text) of each fault line of a log tail, in order; never raises."""
    try:
        from sparkserve.observe.analyze import analyze
        from sparkserve.observe.logs import parse_log

        an = analyze([parse_log("\n".join(lines) + "\n", file="tail")])
        return [(e.line, e.text.rstrip()) for _, e in an.faults]
    except Exception:  # noqa: BLE001
        return []


POLL_S = 0.2  # between full looks at the nodes; one look costs a few round trips per node
API_POLL_S = 0.02  # between looks at the head's API only (a refused connection: well under a millisecond)


def wait_ready(
    plan: Plan,
    nodes: dict[str, Node],
    containers: dict[str, str],
    *,
    timeout_s: float,
    floors: Floors | None = None,
    poll_s: float = POLL_S,
    on_update: Callable[[list[NodeView], float], None] | None = None,
) -> float:
    """Block until the head lists ``plan.served_name`` on /v1/models; return the seconds it took.

    Every rank is looked at every ``poll_s``; between two looks only the API is asked (every
    :data:`API_POLL_S`), and the moment it serves, every rank is looked at once more before the wait
    returns: readiness is seen within milliseconds, never on a stale look at the ranks.

    Raises BootFailure naming the node when a rank's container stops, logs a fatal line, or memory
    falls below the floor; RemoteFailure on timeout.
    """
    t0 = time.monotonic()
    views = _views(plan, containers)
    engines = {name: engine_for(node, plan) for name, node in nodes.items()}
    key = plan.head.secret_env.get(API_KEY_ENV)
    via = proxy_for(plan.api_url)  # once: the environment is read for it
    while True:
        _poll_all(views, engines, nodes, floors)
        elapsed = time.monotonic() - t0
        if on_update:
            on_update(views, elapsed)
        if _serves(plan, key, via):
            for v in views:
                v.phase = Phase.SERVING
            if on_update:
                on_update(views, elapsed)
            return elapsed
        if elapsed > timeout_s:
            head = views[0]
            raise BootFailure(head.node, "wait ready", f"{plan.api_url} did not serve {plan.served_name!r} "
                              f"within {timeout_s:.0f}s (phase {head.phase.value})", explain(head.log))
        _until_serving(plan, key, via, time.monotonic() + poll_s)


def _serves(plan: Plan, api_key: str | None, via: SplitResult | None, timeout: float = 2.0) -> bool:
    models = served_models(plan.api_url, timeout, api_key=api_key, via=via)
    return models is not None and plan.served_name in models


def _until_serving(plan: Plan, api_key: str | None, via: SplitResult | None, deadline: float) -> None:
    """Ask only the API, every :data:`API_POLL_S`, until it serves or ``deadline`` (monotonic) passes."""
    while (left := deadline - time.monotonic()) > 0:
        interrupts.raise_in_worker()  # a replica's boot in a thread stops when Ctrl-C lands
        time.sleep(min(API_POLL_S, left))
        left = deadline - time.monotonic()
        if left > 0 and _serves(plan, api_key, via, timeout=max(0.05, left)):
            return


def wait_running(plan: Plan, nodes: dict[str, Node], containers: dict[str, str]) -> None:
    """One look at every given rank (in parallel): each container still runs and has logged no fatal line.
    Raises BootFailure like :func:`wait_ready` otherwise (ray: the head before its workers start)."""
    views = _views(plan, containers)
    engines = {name: engine_for(nodes[name], plan) for name in containers}
    _poll_all(views, engines, nodes, None)


def _views(plan: Plan, containers: dict[str, str]) -> list[NodeView]:
    """One view per rank that has a container here, in plan order (the head first)."""
    return [NodeView(s.node, s.rank, containers[s.node]) for s in plan.specs if s.node in containers]


def _poll_all(views: list[NodeView], engines: dict[str, Runtime], nodes: dict[str, Node],
              floors: Floors | None) -> None:
    """One poll of every watched rank in parallel; raise the earliest failure."""
    on_all(views, lambda v: _poll_node(v, engines[v.node], nodes[v.node], floors), name=lambda v: v.node)
    failure = _first_failure(views)
    if failure is not None:
        raise failure


def watch_alive(plan: Plan, nodes: dict[str, Node], containers: dict[str, str], *, seconds: float,
                poll_s: float = POLL_S) -> None:
    """Keep polling every rank for ``seconds`` after the gates passed (the settle window): a rank that
    dies or logs a fatal line just after them fails `up` too. Raises BootFailure at the step "settle"."""
    t0 = time.monotonic()
    views = _views(plan, containers)
    for v in views:
        v.when = "after the gates passed"
    engines = {name: engine_for(nodes[name], plan) for name in containers}
    while True:
        try:
            _poll_all(views, engines, nodes, None)
        except BootFailure as e:
            if e.step == "docker":  # the node's docker, not the rank: its headline already says when
                raise
            raise BootFailure(e.node or "?", "settle", f"{e.what}, {time.monotonic() - t0:.1f}s after the gates "
                              "passed", e.details) from None
        if time.monotonic() - t0 >= seconds:
            return
        interrupts.raise_in_worker()
        time.sleep(poll_s)


def daemons_answer(cfg: Config, nodes: dict[str, Node], plan: Plan, containers: dict[str, str], when: str) -> None:
    """RemoteFailure (exit 3, step "docker") naming the first node whose docker daemon does not answer (runtime
    docker only)."""
    if plan.runtime != "docker":
        return
    names = [n.name for n in cfg.nodes if n.name in containers]
    answers = on_all(names, lambda name: _daemon_verdict(engine_for(nodes[name], plan), containers[name]))
    for name in names:
        rank = next((s.rank for s in plan.specs if s.node == name), "?")
        if answers[name] == "gone":
            raise RemoteFailure(f"{name}: docker", f"the node's docker daemon stopped answering {when}; rank {rank} "
                                f"container {containers[name][:12]} may still be on the node — run `sparkserve down` "
                                "once its docker is back", node=name, step="docker")
        if answers[name] == "restarted":
            raise RemoteFailure(f"{name}: docker", f"the node's docker daemon stopped answering {when} (it restarted "
                                f"since rank {rank}'s container {containers[name][:12]} started, and stopped that "
                                "container)", node=name, step="docker")


def _daemon_verdict(eng: Runtime, container: str) -> str:
    """``gone`` (the node's docker does not answer), ``restarted`` (it answers, but restarted since the rank's
    container started and stopped it: see Engine.restarted_since) or ``ok``."""
    if not eng.daemon_answers():
        return "gone"
    try:
        st = eng.state(container)
    except SparkserveError:
        return "ok"  # the gates' own verdict stands
    return "restarted" if daemon_fault(eng, container, st) else "ok"


def daemon_fault(eng: Runtime, container: str, st: ContainerState) -> str | None:
    """Why a stopped rank is its node's docker daemon's doing, not the engine's (None: the engine's own, or it
    runs). Asked before a stopped container is blamed anywhere (the boot watch, the settle window, the gates,
    supervise)."""
    if st.running:
        return None
    if not eng.daemon_answers(watch_s=_daemon_watch_s(st)):
        return "the node's docker daemon stopped answering, and the rank's container was stopped with it"
    if stopped_by_signal(st) and eng.restarted_since(container, st.started_at):
        return "the node's docker daemon restarted since the rank's container started, and stopped that container"
    return None
