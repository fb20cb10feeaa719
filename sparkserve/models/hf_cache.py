"""Models in the Hugging Face cache: ``org/name[@rev]`` repo ids and ``…/snapshots/<rev>`` paths.

The hub cache keeps a model as ``<hub>/models--org--name/`` with ``refs/<branch>`` (a file holding the
commit sha), ``snapshots/<sha>/`` (a directory of *relative* symlinks, ``../../blobs/<hash>``) and
``blobs/`` (the bytes). Bind-mounting a snapshot directory alone leaves those links dangling inside the
container, so :func:`mount_for` mounts the whole repo directory and names the snapshot inside it.

sparkserve never downloads a model: a repo id or revision that is not in the cache is an error that says
which command would fetch it (:func:`download_hint`).

    parse_repo_id("zai-org/GLM-5.3-Flash@main")     # RepoRef("zai-org", "GLM-5.3-Flash", "main")
    snapshot_of("/h/hub/models--a--b/snapshots/0123…")   # HFSnapshot(repo_dir=…/models--a--b, revision=…)
    mount_for("/h/hub/models--a--b/snapshots/0123…", "/models/target")
        # ("/h/hub/models--a--b", "/models/target/snapshots/0123…")
    resolve_local(RepoRef(...), Path("~/.cache/huggingface/hub").expanduser())   # the snapshot dir here
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from sparkserve.errors import BadInput
from sparkserve.models.files import BadFile, read_regular

_ID_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO_ID = re.compile(rf"^(?P<org>{_ID_PART})/(?P<name>{_ID_PART})(?:@(?P<rev>[A-Za-z0-9][A-Za-z0-9._/-]{{0,199}}))?$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_SNAPSHOT = re.compile(r"^(?P<repo>.*/models--(?P<org>[^/]+?)--(?P<name>[^/]+))/snapshots/(?P<rev>[^/]+)/?$")
DEFAULT_HUB = "~/.cache/huggingface/hub"  # HF_HUB_CACHE, or $HF_HOME/hub, when those are not set


@dataclass(frozen=True)
class RepoRef:
    """``org/name`` at ``revision`` (a branch, a tag or a commit sha; None: ``main``)."""

    org: str
    name: str
    revision: str | None = None

    @property
    def repo_id(self) -> str:
        return f"{self.org}/{self.name}"

    @property
    def rev(self) -> str:
        return self.revision or "main"

    @property
    def dir_name(self) -> str:
        return f"models--{self.org}--{self.name}"

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class HFSnapshot:
    """A snapshot directory of the hub cache: its repo directory and the commit it holds."""

    path: str
    repo_dir: str
    repo_id: str
    revision: str


def parse_repo_id(s: str) -> RepoRef | None:
    """``org/name`` or ``org/name@rev`` as a RepoRef; None for anything else (a path, say)."""
    m = _REPO_ID.match(s)
    if not m or s.startswith(("/", ".", "~")):
        return None
    return RepoRef(m["org"], m["name"], m["rev"])


def snapshot_of(path: str) -> HFSnapshot | None:
    """The hub-cache snapshot ``path`` is (``…/models--org--name/snapshots/<rev>``), or None."""
    m = _SNAPSHOT.match(posixpath.normpath(path))
    if not m:
        return None
    return HFSnapshot(posixpath.normpath(path), m["repo"], f"{m['org']}/{m['name']}", m["rev"])


def mount_for(host_path: str, mount_point: str) -> tuple[str, str]:
    """(what to bind-mount, where the model is inside the container) for a model at ``host_path``: a
    snapshot's whole repo directory (its links into ``blobs/`` then resolve), else the directory itself."""
    snap = snapshot_of(host_path)
    if snap is None:
        return host_path, mount_point
    return snap.repo_dir, f"{mount_point}/snapshots/{snap.revision}"


def download_hint(ref: RepoRef | str, where: str = "") -> str:
    """What to say when the files are not there: sparkserve does not download; this command would."""
    rev = ref.revision if isinstance(ref, RepoRef) else None
    repo = ref.repo_id if isinstance(ref, RepoRef) else str(ref)
    cmd = f"hf download {repo}" + (f" --revision {rev}" if rev else "")
    return f"sparkserve does not download models: run `{cmd}` {where or 'on every node'} (huggingface_hub's CLI)"


def resolve_local(ref: RepoRef, hub: Path, *, field: str = "model.target") -> Path:
    """The snapshot directory of ``ref`` in the hub cache at ``hub`` on this machine; BadInput saying what
    is missing (and which command would fetch it) otherwise. Its config.json must resolve (no dangling
    link)."""
    repo = hub / ref.dir_name
    if not repo.is_dir():
        raise BadInput(field, f"{ref} is not in the Hugging Face cache {hub} (no {ref.dir_name}); "
                       f"{download_hint(ref, 'on this machine')}")
    rev = ref.rev
    if _SHA.match(rev):
        sha = rev
    else:
        try:
            sha = read_regular(repo / "refs" / rev, limit=200).decode().strip()
        except BadFile:
            raise BadInput(field, f"{ref}: revision {rev!r} is not in {repo}/refs; "
                           f"{download_hint(ref, 'on this machine')}") from None
    snap = repo / "snapshots" / sha
    if not (snap / "config.json").is_file():
        why = "has no snapshot" if not snap.is_dir() else "has a snapshot whose config.json does not resolve"
        raise BadInput(field, f"{ref}: {repo} {why} for {sha[:12]}; {download_hint(ref, 'on this machine')}")
    return snap
