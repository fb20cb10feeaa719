"""The target model from each node's Hugging Face cache: resolve ``org/name[@rev]`` to a snapshot path,
check that a snapshot path's links resolve, and that every node holds the same revision.

One small stdlib program runs on every node in parallel (the cache is ``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` of the SSH user). The result is the config with
``model.target`` set to the snapshot path, identical on every node; plan.build then mounts the snapshot's
repo directory so its links into ``blobs/`` resolve inside the container (models.hf_cache.mount_for).
A model that is missing is BadInput naming the node and the command that would fetch it: sparkserve does
not download models. A target that is neither a repo id nor a snapshot path costs nothing here.

    cfg = resolve_target(cfg, nodes)     # before validate / up / doctor
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkserve.config import Config
from sparkserve.errors import BadInput
from sparkserve.models.hf_cache import RepoRef, download_hint, parse_repo_id, snapshot_of
from sparkserve.nodes.base import Node
from sparkserve.nodes.parallel import on_all

_PROGRAM = r"""
import json, os, re, sys
a = json.loads(sys.stdin.read())
out = {}
if a.get("snapshot"):
    snap = a["snapshot"]
    out["hub"] = None
else:
    hub = os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub")
                                              if os.environ.get("HF_HOME") else "~/.cache/huggingface/hub")
    hub = os.path.abspath(os.path.expanduser(hub))
    out["hub"] = hub
    repo = os.path.join(hub, a["dir"])
    out["repo"] = os.path.isdir(repo)
    rev = a["rev"]
    sha = rev if re.fullmatch(r"[0-9a-f]{40}", rev) else None
    if sha is None and out["repo"]:
        try:
            with open(os.path.join(repo, "refs", rev)) as f:
                sha = f.read(200).strip()
        except OSError:
            sha = None
    out["sha"] = sha
    snap = os.path.join(repo, "snapshots", sha) if sha else None
out["snapshot"] = snap
out["dir"] = bool(snap) and os.path.isdir(snap)
out["config"] = bool(snap) and os.path.isfile(os.path.join(snap, "config.json"))
dangling = []
if out["dir"]:
    for name in sorted(os.listdir(snap))[:10000]:
        p = os.path.join(snap, name)
        if os.path.islink(p) and not os.path.exists(p):
            dangling.append(name)
out["dangling"] = dangling[:5]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class NodeModel:
    """What one node's cache holds for the target."""

    hub: str | None
    repo: bool
    sha: str | None
    snapshot: str | None
    dir: bool
    config: bool
    dangling: list[str]


def _ask(node: Node, args: dict[str, object]) -> NodeModel:
    res = node.run(["python3", "-c", _PROGRAM], stdin=json.dumps(args).encode(), step="model", timeout=30)
    d = json.loads(res.stdout)
    return NodeModel(d.get("hub"), bool(d.get("repo", True)), d.get("sha"), d.get("snapshot"), bool(d["dir"]),
                     bool(d["config"]), list(d.get("dangling", [])))


def _user(cfg: Config, name: str) -> str:
    node = next(n for n in cfg.nodes if n.name == name)
    return node.user


def resolve_target(cfg: Config, nodes: dict[str, Node]) -> Config:
    """``cfg`` with ``model.target`` resolved (see the module docstring); ``cfg`` itself when the target is
    a plain directory. BadInput (``model.target``) when a node lacks it or the nodes disagree."""
    target = str(cfg.model.target)
    ref = parse_repo_id(target)
    snap = snapshot_of(target) if ref is None else None
    if ref is None and snap is None:
        return cfg
    ordered = [nodes[n.name] for n in cfg.nodes if n.name in nodes]
    args: dict[str, object] = ({"dir": ref.dir_name, "rev": ref.rev} if ref is not None
                               else {"snapshot": snap.path if snap else target})
    found = on_all(ordered, lambda n: _ask(n, args), name=lambda n: n.name)
    for name, m in found.items():
        where = f"on {name} (as {_user(cfg, name)})"
        if ref is not None and not m.repo:
            raise BadInput("model.target", f"{ref} is not in the Hugging Face cache on {name} ({m.hub} has no "
                           f"{ref.dir_name}); {download_hint(ref, where)}")
        if ref is not None and m.sha is None:
            raise BadInput("model.target", f"{ref}: revision {ref.rev!r} is not in {m.hub}/{ref.dir_name}/refs "
                           f"on {name}; {download_hint(ref, where)}")
        if not m.config:
            what = ("has no snapshot directory" if not m.dir else
                    f"has dangling links ({', '.join(m.dangling)}: their blobs are missing)" if m.dangling else
                    "has no config.json")
            hint = download_hint(ref or RepoRef(*(snap.repo_id.split("/", 1) if snap else ("?", "?")),
                                                snap.revision if snap else None), where)
            raise BadInput("model.target", f"{m.snapshot} {what} on {name}; {hint}")
    if ref is None:
        return cfg
    shas = {name: m.sha for name, m in found.items()}
    if len(set(shas.values())) > 1:
        said = ", ".join(f"{k} {(v or '?')[:12]}" for k, v in shas.items())
        raise BadInput("model.target", f"{ref} is not the same revision on every node ({said}); pin one "
                       f"({ref.repo_id}@<sha>) or update the cache on every node")
    paths = {name: m.snapshot for name, m in found.items()}
    if len(set(paths.values())) > 1:
        said = ", ".join(f"{k}: {v}" for k, v in paths.items())
        raise BadInput("model.target", f"{ref} is cached at different paths ({said}); the bind mount is one "
                       "path on every node: set HF_HUB_CACHE to one directory, or give the snapshot path")
    resolved = next(iter(paths.values()))
    new = cfg.model_copy(deep=True)
    new.model = new.model.model_copy(update={"target": resolved})
    return new


def is_hf_target(cfg: Config) -> bool:
    """Whether ``model.target`` is a repo id or a hub-cache snapshot (so :func:`resolve_target` asks)."""
    t = str(cfg.model.target)
    return parse_repo_id(t) is not None or snapshot_of(t) is not None
