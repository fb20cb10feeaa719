"""The pure pre-flight rules (plan.validate) on the drafter and target, wherever they live.

A model directory that is only on the head is mirrored here as metadata (config.json, index files, the
mask file, safetensors headers at their real size; see remotemeta), never as weights, so the same judge
reads a local and a remote model alike.
"""

from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sparkserve.config import Config
from sparkserve.deploy.drafter import local_drafter
from sparkserve.deploy.remotemeta import fetch_meta
from sparkserve.nodes.base import Node
from sparkserve.plan.validate import validate


def validate_inputs(cfg: Config, nodes: dict[str, Node]) -> None:
    """Every pre-flight rule on the config, drafter and target; warnings go to stderr, the first problem
    is raised (BadInput, exit 2). Nothing is started or changed on any node."""
    head = nodes[cfg.head.name]
    with tempfile.TemporaryDirectory(prefix="sparkserve-") as tmp, \
            ThreadPoolExecutor(max_workers=2) as pool:  # both fetches at once
        drafter_dir: Path | None = local_drafter(cfg)
        f_drafter = None
        if drafter_dir is None:
            f_drafter = pool.submit(fetch_meta, head, str(cfg.drafter.path), Path(tmp) / "drafter",
                                    field="drafter.path")
        target_dir = Path(cfg.model.target)
        f_target = None
        if not (target_dir / "config.json").is_file():
            f_target = pool.submit(fetch_meta, head, str(cfg.model.target), Path(tmp) / "target",
                                   field="model.target")
        if f_drafter is not None:  # the drafter's problem first: it is the one people change
            drafter_dir = f_drafter.result()
        if f_target is not None:
            target_dir = f_target.result()
        report = validate(cfg, drafter_dir=drafter_dir, target_dir=target_dir, parser="list")
        for w in report.warnings:
            print(f"warning: {w.where}: {w.what}", file=sys.stderr)
        report.raise_first()
