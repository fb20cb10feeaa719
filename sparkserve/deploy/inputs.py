"""The pure pre-flight rules (plan.validate) on the drafter and target, wherever they live.

A model directory on this machine is read here; one that is only on the head is mirrored here as metadata
(config.json, index files, the mask file, safetensors headers at their real size; see remotemeta), never as
weights, so the same judge reads a local and a remote model alike. `up` and `validate` both go through
:func:`model_inputs`, so they agree on what is read where.

    with model_inputs(cfg, head) as where:          # head=None: offline, local copies only
        report = validate(cfg, drafter_dir=where.drafter, target_dir=where.target,
                          read_drafter=where.drafter is not None, read_target=where.target is not None)
        where.said   # {"drafter": "on spark-a (head): /models/x", "target": "this machine: /data/t"}
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sparkserve.config import Config
from sparkserve.config.profiles import uses_drafter
from sparkserve.deploy.drafter import drafter_words, local_drafter
from sparkserve.deploy.remotemeta import fetch_metas
from sparkserve.errors import BadInput
from sparkserve.nodes.base import Node
from sparkserve.plan.findings import Finding, Report
from sparkserve.plan.validate import validate


@dataclass
class ModelInputs:
    """Where each model is read from: a local directory (a copy here, or mirrored metadata), or None (not
    read: offline and not on this machine, or missing on the head: ``missing``); ``said`` is one phrase per
    model for people."""

    drafter: Path | None = None
    target: Path | None = None
    said: dict[str, str] = field(default_factory=dict)
    missing: list[BadInput] = field(default_factory=list)  # a model the head does not have either


@contextlib.contextmanager
def model_inputs(cfg: Config, head: Node | None, *, local: tuple[str, ...] = ()) -> Iterator[ModelInputs]:
    """The drafter and target as local directories: this machine's copy when it has one, else the head's
    metadata (``head`` None: not read at all). Models named in ``local`` ("drafter", "target": given on the
    command line) are read here even when missing, so the miss is reported. What the head is asked for,
    it is asked in one run."""
    out = ModelInputs()
    with tempfile.TemporaryDirectory(prefix="sparkserve-") as tmp:
        drafter_dir = local_drafter(cfg)
        if drafter_dir is None and "drafter" in local and cfg.drafter:
            drafter_dir = Path(cfg.drafter.path)
        target_dir: Path | None = Path(cfg.model.target)
        if not (target_dir / "config.json").is_file() and "target" not in local:
            target_dir = None
        wanted: dict[str, tuple[str, Path, str]] = {}
        if drafter_dir is None and head is not None and uses_drafter(cfg):  # mtp: no drafter to read
            wanted["drafter"] = (str(cfg.drafter.path), Path(tmp) / "drafter", "drafter.path")
        if target_dir is None and head is not None:
            wanted["target"] = (str(cfg.model.target), Path(tmp) / "target", "model.target")
        fetched = dict(zip(wanted, fetch_metas(head, list(wanted.values())), strict=True)) if head else {}
        # the drafter's problem first: it is the one people change
        for model, here, where in (("drafter", drafter_dir, drafter_words(cfg)), ("target", target_dir,
                                                                                 cfg.model.target)):
            if model == "drafter" and not uses_drafter(cfg):
                out.said[model] = str(where)
            elif model in fetched:
                got = fetched[model]
                if isinstance(got, BadInput):
                    out.missing.append(got)
                else:
                    setattr(out, model, got)
                out.said[model] = f"on {cfg.head.name} (head): {where}"
            elif here is not None:
                setattr(out, model, here)
                out.said[model] = f"this machine: {here}"
            else:
                out.said[model] = f"not read: {where} is not on this machine (--offline)"
        yield out


def needs_head(cfg: Config, *, local: tuple[str, ...] = ()) -> bool:
    """Whether a model is on neither this machine nor the command line (so only the head can tell)."""
    drafter_here = "drafter" in local or local_drafter(cfg) is not None or not uses_drafter(cfg)
    target_here = "target" in local or (Path(cfg.model.target) / "config.json").is_file()
    return not (drafter_here and target_here)


def check_inputs(cfg: Config, head: Node | None, *, parser: str = "list",
                 local: tuple[str, ...] = ()) -> tuple[Report, ModelInputs]:
    """Every pre-flight rule, with each model read where it is (see :func:`model_inputs`); a model the head
    lacks too is an error of the report, like any other."""
    with model_inputs(cfg, head, local=local) as where:
        report = validate(cfg, drafter_dir=where.drafter, target_dir=where.target, parser=parser,  # type: ignore[arg-type]
                          read_drafter=where.drafter is not None, read_target=where.target is not None)
    for i, e in enumerate(where.missing):
        report.errors.insert(i, Finding(e.where, e.what))
    return report, where


def validate_inputs(cfg: Config, nodes: dict[str, Node]) -> None:
    """Every pre-flight rule on the config, drafter and target; warnings go to stderr, the first problem
    is raised (BadInput, exit 2). Nothing is started or changed on any node."""
    report, _ = check_inputs(cfg, nodes[cfg.head.name])
    for w in report.warnings:
        print(f"warning: {w.where}: {w.what}", file=sys.stderr)
    report.raise_first()
