"""One setting written into the config file in place (``tune --apply``): a ruamel.yaml round trip, as
:func:`sparkserve.deploy.active_drafter.write_config_drafter` does for the drafter — comments, key order and
the file's own indentation kept; written to a temporary file and renamed, so a failure leaves it as it was.

    write_config_setting(Path("sparkserve.yaml"), "speculative.num_speculative_tokens", 5,
                         "sparkserve tune: campaign 12, c16: K=5 …")
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from sparkserve.deploy.active_drafter import _mapping_indent
from sparkserve.errors import BadInput


def write_config_setting(config_file: Path, dotted: str, value: Any, comment: str) -> None:
    """Set ``dotted`` (``section.key`` or deeper) to ``value`` with ``comment`` at the end of its line.
    BadInput naming the file when it cannot be read, parsed or written."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.util import load_yaml_guess_indent

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        text = config_file.read_text()
        data = yaml.load(text)
        _, seq_indent, seq_offset = load_yaml_guess_indent(text)
    except OSError as e:
        raise BadInput(str(config_file), f"cannot read config: {e.strerror or e}") from None
    except YAMLError as e:
        raise BadInput(str(config_file), f"not valid YAML: {e}") from None
    yaml.indent(mapping=_mapping_indent(text), sequence=seq_indent or 2, offset=seq_offset or 0)
    if not isinstance(data, dict):
        raise BadInput(str(config_file), "the config must be a YAML mapping")
    *parents, leaf = dotted.split(".")
    node = data
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = CommentedMap()
        node = node[p]
    if isinstance(value, list):
        seq = CommentedSeq(value)
        seq.fa.set_flow_style()
        value = seq
    node[leaf] = value
    if hasattr(node, "yaml_add_eol_comment"):
        node.yaml_add_eol_comment("# " + " ".join(comment.split()), leaf)
    fd, tmp = tempfile.mkstemp(prefix=f".{config_file.name}.", dir=config_file.parent)
    try:
        with os.fdopen(fd, "w") as f:
            yaml.dump(data, f)
        os.chmod(tmp, config_file.stat().st_mode & 0o7777)
        os.replace(tmp, config_file)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise BadInput(str(config_file), f"cannot write: {e.strerror or e}") from None
