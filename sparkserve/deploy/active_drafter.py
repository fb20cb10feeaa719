"""A swapped drafter that sticks: written into the config file, or kept in the journal for `up`.

After a successful `swap-drafter`, :func:`write_config_drafter` sets ``drafter.path`` (where it now is on
every node) and ``drafter.source`` (this machine's copy) in the config file, in place, by a ruamel.yaml
round trip: comments, key order and the rest of the file are kept. With ``--no-write`` (or no config file
to write: the embedded default), :func:`remember` records it in the journal under the config's
fingerprint, and :func:`kept_drafter` gives it back to the next `up` of that same config.

    path = write_config_drafter(Path("sparkserve.yaml"), "/models/new-0a1b2c3d4e5f", Path("./new"))
    remember(cfg, "/models/new-0a1b2c3d4e5f", "./new", digest)   # --no-write
    cfg2, kept = kept_drafter(cfg)          # `up`: the journal's drafter, or (cfg, None)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve import journal
from sparkserve.config import Config
from sparkserve.deploy.config_write import edit_config


@dataclass(frozen=True)
class KeptDrafter:
    """The drafter `swap-drafter --no-write` left active for a config."""

    path: str
    source: str | None
    digest: str
    time: str


def write_config_drafter(config_file: Path, node_path: str, source: Path | None) -> None:
    """Set ``drafter.path`` / ``drafter.source`` in ``config_file`` in place (comments kept; written to a
    temporary file and renamed, so a failure leaves the file as it was). BadInput naming the file when it
    cannot be read, parsed or written."""

    def change(data: Any) -> None:
        if not isinstance(data.get("drafter"), dict):
            data["drafter"] = {}
        data["drafter"]["path"] = node_path
        if source is not None:
            data["drafter"]["source"] = str(source)
        else:
            data["drafter"].pop("source", None)

    edit_config(config_file, change)




def remember(cfg: Config, node_path: str, source: str | None, digest: str) -> None:
    """Record in the journal that ``cfg`` (as its file is written) now serves this drafter."""
    journal.record("active_drafter", config_sha256=cfg.fingerprint(), drafter_path=node_path,
                   drafter_source=source, digest=digest)


def forget(cfg: Config) -> None:
    """Drop the journal's active drafter for ``cfg`` (the config's own drafter applies again)."""
    journal.record("clear_active_drafter", config_sha256=cfg.fingerprint())


def kept_drafter(cfg: Config) -> tuple[Config, KeptDrafter | None]:
    """``cfg`` with the drafter the journal keeps for it (``swap-drafter --no-write``), or ``(cfg, None)``."""
    row = journal.lookup(lambda j: j.active_drafter(cfg.fingerprint()), None)
    if row is None or Path(row["path"]) == Path(str(cfg.drafter.path)):
        return cfg, None
    kept = KeptDrafter(row["path"], row["source"], row["digest"], row["time"])
    source = Path(kept.source) if kept.source and Path(kept.source).is_dir() else None
    new = cfg.model_copy(deep=True)
    new.drafter = new.drafter.model_copy(update={"path": Path(kept.path), "source": source})
    return new, kept
