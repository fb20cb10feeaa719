"""Settings written into the config file in place, by a ruamel.yaml round trip: comments, key order and the
file's own indentation kept; written to a temporary file and renamed, so a failure leaves it as it was. One
round trip (:func:`edit_config`) for every writer: ``swap-drafter`` (:mod:`sparkserve.deploy.active_drafter`)
and ``tune --apply`` (:func:`write_config_setting`).

    write_config_setting(Path("sparkserve.yaml"), "speculative.num_speculative_tokens", 5,
                         "sparkserve tune: campaign 12, c16: K=5 …")
    edit_config(Path("sparkserve.yaml"), lambda data: data["drafter"].update(path="/models/d"))
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkserve.errors import BadInput


def edit_config(config_file: Path, change: Callable[[Any], None]) -> None:
    """Load ``config_file`` (round trip), let ``change`` edit the top-level mapping in place, write it back.
    BadInput naming the file when it cannot be read, parsed or written, or is not a mapping."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.util import load_yaml_guess_indent

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap the user's long lines
    try:
        text = config_file.read_text()
        data = yaml.load(text)
        _, seq_indent, seq_offset = load_yaml_guess_indent(text)
    except OSError as e:
        raise BadInput(str(config_file), f"cannot read config: {e.strerror or e}") from None
    except YAMLError as e:
        raise BadInput(str(config_file), f"not valid YAML: {e}") from None
    # the file's own indentation: ruamel's default would move `- name:` under `nodes:` to column 0
    yaml.indent(mapping=_mapping_indent(text), sequence=seq_indent or 2, offset=seq_offset or 0)
    if not isinstance(data, dict):
        raise BadInput(str(config_file), "the config must be a YAML mapping")
    change(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{config_file.name}.", dir=config_file.parent)
    try:
        with os.fdopen(fd, "w") as f:
            yaml.dump(data, f)
        os.chmod(tmp, config_file.stat().st_mode & 0o7777)
        os.replace(tmp, config_file)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise BadInput(str(config_file), f"cannot write: {e.strerror or e}") from None


def write_config_setting(config_file: Path, dotted: str, value: Any, comment: str) -> None:
    """Set ``dotted`` (``section.key`` or deeper) to ``value`` with ``comment`` at the end of its line.
    BadInput naming the file when it cannot be read, parsed or written."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    def change(data: Any) -> None:
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = CommentedMap()
            node = node[p]
        v = value
        if isinstance(v, list):
            v = CommentedSeq(v)
            v.fa.set_flow_style()
        node[leaf] = v
        if hasattr(node, "yaml_add_eol_comment"):
            node.yaml_add_eol_comment("# " + " ".join(comment.split()), leaf)

    edit_config(config_file, change)


def _mapping_indent(text: str) -> int:
    """How far the file indents a nested mapping's keys (the first indented ``key:`` line under a top-level
    key); 2 when it has none."""
    parent = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            parent = line.endswith(":")
        elif parent and not line.lstrip().startswith("-") and ":" in line:
            return indent
        else:
            parent = False
    return 2
