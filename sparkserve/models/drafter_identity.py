"""Which of the model card's drafters a directory holds, told from its files alone.

The card (canada-quant/vllm-glm53-flash-sm121, ``drafter/cards/GLM-5.3-Flash-DFlash2-{E,F,G}.md`` and
``drafter/README.md``) names four DFlash2 drafters for GLM-5.3-Flash:

* **E, F, G** — canada-quant's own releases, Apache-2.0: "same architecture, same serve contract, drop-in";
  the G card's provenance gives ``config.json`` sha256 ``699bdf29…c51778``, "identical to -E / -F". Their
  architecture: ``DFlash2DraftModel``, 8 full-attention layers (no sliding window), hidden 4096, 9 taps at
  target layers [5, 9, 14, 19, 24, 28, 33, 38, 42], block size 8 (K = 7), mask_token_id 154856. Since their
  config.json is identical, *which* release is not in it: the directory's name says it (``…-DFlash2-G``),
  or nothing does.
* **the incoai reference** (incoai/GLM-5.3-Flash-DFlash2, CC-BY-NC-ND-4.0): its layers keep a 2,048-token
  sliding window (~7 KB of KV per token against ~22 KB for E/F/G), which is what lets 1M context fit.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve.models.drafter import DrafterFacts
from sparkserve.models.files import CONFIG_LIMIT, BadFile, MissingFile, read_regular

EFG_CONFIG_SHA256 = ("699bdf29", "c51778")  # the card prints the digest shortened: its head and tail
EFG_TAPS = [5, 9, 14, 19, 24, 28, 33, 38, 42]
EFG_SHAPE = {"num_hidden_layers": 8, "hidden_size": 4096, "block_size": 8, "mask_token_id": 154856}
INCOAI_WINDOW = 2048
INCOAI_LICENCE = "CC-BY-NC-ND-4.0"
_RELEASE = re.compile(r"DFlash2-([EFG])$", re.IGNORECASE)


@dataclass(frozen=True)
class DrafterIdentity:
    family: str | None  # "E/F/G" | "incoai" | None (not one of the card's)
    release: str | None  # "E" | "F" | "G" (from the directory's name) | "incoai" | None
    evidence: str
    licence: str | None = None

    @property
    def name(self) -> str:
        if self.family is None:
            return "not one of the card's drafters"
        if self.family == "incoai":
            return f"the incoai reference drafter ({INCOAI_LICENCE})"
        if self.release:
            return f"canada-quant DFlash2-{self.release}"
        return "canada-quant DFlash2 E/F/G (which release: not in config.json)"

    def to_json(self) -> dict[str, str | None]:
        return {"family": self.family, "release": self.release, "name": self.name, "evidence": self.evidence,
                "licence": self.licence}


def _config(path: Path) -> tuple[str | None, dict[str, Any]]:
    """(sha256, parsed) of a drafter's config.json; (None, {}) when it cannot be read."""
    try:
        raw = read_regular(path / "config.json", limit=CONFIG_LIMIT)
    except (BadFile, MissingFile, OSError):
        return None, {}
    try:
        data = json.loads(raw)
    except ValueError:
        data = {}
    return hashlib.sha256(raw).hexdigest(), data if isinstance(data, dict) else {}


def sliding_window(d: DrafterFacts, cfg: dict[str, Any]) -> int | None:
    """The drafter's attention window (vLLM: dflash_config.swa_window_size, else the top-level sliding_window,
    when dflash_config.use_swa or sliding layer_types ask for one); None: full attention."""
    dc = d.dflash_config
    layer_types = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else []
    if not (dc.get("use_swa") or "sliding_attention" in layer_types):
        return None
    w = dc.get("swa_window_size", cfg.get("sliding_window"))
    return w if isinstance(w, int) else None


def identify(d: DrafterFacts, *, name_hint: str | None = None) -> DrafterIdentity:
    """Name the card's drafter ``d`` is, from its config.json (digest, then shape) and its directory's name
    (``name_hint``: the configured path, when ``d`` was read from a copy under another name)."""
    path = Path(d.path)
    digest, cfg = _config(path)
    window = sliding_window(d, cfg)
    if d.kind == "dflash2" and window == INCOAI_WINDOW:
        return DrafterIdentity("incoai", "incoai", f"DFlash2 with a {INCOAI_WINDOW}-token sliding window",
                               INCOAI_LICENCE)
    m = _RELEASE.search(Path(name_hint).name if name_hint else path.name)
    release = m.group(1).upper() if m else None
    named = f"; the directory names -{release}" if release else "; the directory does not name the release"
    if digest and digest.startswith(EFG_CONFIG_SHA256[0]) and digest.endswith(EFG_CONFIG_SHA256[1]):
        return DrafterIdentity("E/F/G", release, f"config.json sha256 {digest[:8]}…{digest[-6:]}, the one E, F "
                               f"and G share{named}")
    shape = {"num_hidden_layers": d.num_hidden_layers, "hidden_size": d.hidden_size, "block_size": d.block_size,
             "mask_token_id": d.mask_token_id}
    if d.kind == "dflash2" and shape == EFG_SHAPE and d.target_layer_ids == EFG_TAPS and not window:
        return DrafterIdentity("E/F/G", release, "E/F/G's architecture (8 full-attention layers, 9 taps, block 8, "
                               f"mask 154856) but another config.json digest{named}")
    return DrafterIdentity(None, None, "neither E/F/G's config.json nor the incoai reference's sliding window")
