"""The target's chat template read from the head over SSH, for ``bench --protocol card`` from a laptop.

Example::

    if needs_remote_template(cfg):               # model.target is a path this machine does not have
        tpl_dir = head_template_dir(cfg, head)   # a local copy of its tokenizer_config.json / chat_template.jinja

The card's client renders every prompt with the target's tokenizer chat template; the target lives on the
head, which sparkserve reaches over SSH. One run on the head answers the target's manifest
(:func:`sparkserve.models.target_manifest.target_manifest`, shipped by source: index sha256 and safetensors
headers, no weights read) and the sha256 of the three files a chat template is made of; the local copy is kept
under ``$XDG_CACHE_HOME/sparkserve/chat-templates/<manifest digest>/`` and used while every file's sha256 still
matches the head's, else the files are fetched again (SFTP). ``--chat-template`` stays the override.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from sparkserve.config import Config
from sparkserve.errors import BadInput
from sparkserve.measure.chat_template import SPECIAL_TOKENS_MAP, TEMPLATE_FILE, TOKENIZER_CONFIG
from sparkserve.models.hf_cache import parse_repo_id
from sparkserve.models.target_manifest import NODE_SOURCE as MANIFEST_SOURCE
from sparkserve.nodes.base import Node

FILES = (TOKENIZER_CONFIG, TEMPLATE_FILE, SPECIAL_TOKENS_MAP)

_PROGRAM = MANIFEST_SOURCE + r"""
import hashlib, json, os, sys
a = json.loads(sys.stdin.read())
root = a["root"]
out = {"exists": os.path.isdir(root), "manifest": None, "files": {}}
if out["exists"]:
    out["manifest"] = target_manifest(root)
    for name in a["files"]:
        p = os.path.join(root, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out["files"][name] = hashlib.sha256(f.read()).hexdigest()
print(json.dumps(out))
"""


def needs_remote_template(cfg: Config) -> bool:
    """True when ``model.target`` is a directory path that this machine does not have (then it is on the
    nodes). A Hugging Face repo id is looked up in this machine's cache instead, as before."""
    target = str(cfg.model.target)
    return parse_repo_id(target) is None and not Path(target).expanduser().is_dir()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sparkserve" / "chat-templates"


def _digest(manifest: dict[str, object]) -> str:
    keep = {k: manifest.get(k) for k in ("index_sha256", "shards", "headers_sha256")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def head_template_dir(cfg: Config, head: Node, *, say: Callable[[str], None] = lambda _: None) -> Path:
    """A local directory holding the target's chat-template files as the head has them (cached by the
    target's manifest); BadInput naming ``model.target`` when the head has no such directory or no template."""
    target = str(cfg.model.target)
    res = head.run(["python3", "-c", _PROGRAM], stdin=json.dumps({"root": target, "files": FILES}).encode(),
                   step="chat template", timeout=120)
    answer = json.loads(res.stdout)
    if not answer["exists"]:
        raise BadInput("model.target", f"{target} is not on this machine, nor on the head {head.name}: give "
                       "--chat-template DIR (a copy of the target's tokenizer_config.json / chat_template.jinja)")
    files: dict[str, str] = answer["files"]
    if TOKENIZER_CONFIG not in files and TEMPLATE_FILE not in files:
        raise BadInput("model.target", f"{target} on {head.name} has neither {TEMPLATE_FILE} nor {TOKENIZER_CONFIG}: "
                       "no chat template to render the card's prompts with; give --chat-template DIR")
    into = cache_root() / _digest(answer["manifest"] or {})
    stale = [n for n, sha in files.items() if _sha(into / n) != sha]
    extra = [n for n in FILES if n not in files and (into / n).exists()]
    if not stale and not extra:
        return into
    into.mkdir(parents=True, exist_ok=True)
    for name in extra:
        (into / name).unlink()
    for name in stale:
        head.get(f"{target.rstrip('/')}/{name}", into / name)
    say(f"bench: the target's chat template read from {head.name}:{target} (cached in {into})")
    return into
