"""The model card's named serving profiles: the values each one renders, and what a config changed.

A profile is a named set of field values the card's authors validated on two DGX Sparks. ``profile:`` in the
config picks one (none: ``g4-262k``, the card's banked launcher); each of its fields applies wherever the config
leaves that field out, so a field the user writes still wins — :func:`overrides` lists those as differences.

It is applied when the config is loaded (a ``Config`` validator calls :func:`apply`), so the plan, the gates,
the fingerprint and the journal all see one set of values. This module is ground: it knows dotted field paths
and plain values, never the ``Config`` class.

Facts, all from canada-quant/vllm-glm53-flash-sm121 (read 2026-12-02):

* ``scripts/launch_glm53_w4a16_dflash2_sm121.sh`` at 1c142c9, its knobs: ``MAX_MODEL_LEN`` 262144 (default)
  | 800000 "with KV_CACHE_MEM=17179869184 GMU=0.90; validated with -G"; ``KV_CACHE_MEM`` default 8053063680
  ("8 GiB -> 366,749-token pool @262K"); ``GMU`` 0.795, "0.90 for the 800K / 1M serves"; 1048576 "validated
  only with the incoai drafter"; ``DRAFTER_HOST_PATH`` default ``/models/GLM-5.3-Flash-DFlash2-G``, "-F / -E
  are drop-ins".
* ``drafter/cards/GLM-5.3-Flash-DFlash2-G.md`` "Memory cost": the KV pools measured on 2x Spark, fp8 KV —
  incoai reference 9 GiB / 1,048,576 / 1,360,420 tokens; -E / -G 8 GiB / 262,144 / 366,749; -G 16 GiB /
  800,000 / 888,729 — and the built-in MTP head ``{"method":"mtp","num_speculative_tokens":3}`` "for long
  context, non-English text, or KV headroom". The reference drafter's licence: CC-BY-NC-ND-4.0.
* The README's 1M line: ``MAX_MODEL_LEN=1048576 GMU=0.90 KV_CACHE_MEM=9663676416``.

The card banks no pool for the MTP head: that profile leaves ``gates.pool_tokens`` unset; ``sparkserve gates --bank``
records the first boot's pool for its deployment and the pool gate judges against it from then on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT = "g4-262k"
CARD = "canada-quant/vllm-glm53-flash-sm121"
INCOAI_LICENCE = "CC-BY-NC-ND-4.0"
# the drafters the card names, by what they are (sparkserve.models.drafter_identity tells them apart)
EFG, INCOAI = "canada-quant E/F/G", "incoai reference"

#: The fields a profile sets, as dotted config paths.
FIELDS = (
    "serve.max_model_len", "serve.kv_cache_memory_bytes", "serve.gpu_memory_utilization", "gates.pool_tokens",
    "gates.mask_token_id", "speculative.method", "speculative.num_speculative_tokens",
)


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    max_model_len: int
    kv_cache_memory_bytes: int
    gpu_memory_utilization: float
    pool_tokens: int | None  # the card's measured pool (None: the card banks none)
    method: str  # speculative.method
    num_speculative_tokens: int
    mask_token_id: int | None
    drafter: str  # what serves the drafts, in words
    validated_with: tuple[str, ...]  # the drafter releases the card validated this profile with ("E", "incoai", …)
    licence: str | None = None  # the drafter's licence, where it restricts use
    source: str = ""
    caveat: str | None = None  # what the card says against the profile, in its words (said on every use)

    @property
    def uses_drafter(self) -> bool:
        return self.method != "mtp"

    def values(self) -> dict[str, Any]:
        """{dotted field: value} this profile renders."""
        return {
            "serve.max_model_len": self.max_model_len,
            "serve.kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "serve.gpu_memory_utilization": self.gpu_memory_utilization,
            "gates.pool_tokens": self.pool_tokens,
            "gates.mask_token_id": self.mask_token_id,
            "speculative.method": self.method,
            "speculative.num_speculative_tokens": self.num_speculative_tokens,
        }

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary, "drafter": self.drafter,
                "validated_with": list(self.validated_with), "licence": self.licence, "source": self.source,
                "caveat": self.caveat, "values": self.values()}


GIB = 2**30
# README@1c142c9, "Drafter or the built-in MTP head?": "**Status:** native MTP on *this* image has not been validated
# by us yet" (a same-pair comparison "running since 2026-10-04", no results published as of 2026-12-07).
MTP_CAVEAT = ("ahead of the card: its README says native MTP on this image \"has not been validated by us yet\"; "
              "the pool gate is banked from this deployment's first passing boot, not the card's")
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("g4-262k", "the card's banked launcher (default): 262K context, the \"8 GiB\" pin", 262144,
            8053063680, 0.795, 366749, "dflash", 7, 154856,
            "DFlash2 drafter, K=7 (-G by default; -F / -E drop-in)", ("E", "F", "G"),
            source="launcher@1c142c9 defaults; DFlash2-G card, Memory cost: -E / -G 8 GiB -> 366,749"),
    Profile("long-800k", "800K context with -G: a 16 GiB pin, GMU 0.90", 800000,
            16 * GIB, 0.90, 888729, "dflash", 7, 154856,
            "DFlash2 drafter -G, K=7", ("G",),
            source="launcher@1c142c9 MAX_MODEL_LEN=800000 knobs; DFlash2-G card: -G 16 GiB -> 888,729"),
    Profile("mtp", "the target's built-in MTP head: no drafter (long context, non-English, KV headroom)", 262144,
            8053063680, 0.795, None, "mtp", 3, None,
            "the W4A16 checkpoint's own MTP head, K=3", (),
            source="DFlash2-G card, Memory cost: {\"method\":\"mtp\",\"num_speculative_tokens\":3}; "
                   "the card banks no MTP pool",
            caveat=MTP_CAVEAT),
    Profile("incoai-1m", "1M context with the card's reference drafter: a 9 GiB pin, GMU 0.90", 1048576,
            9 * GIB, 0.90, 1360420, "dflash", 7, None,
            f"incoai/GLM-5.3-Flash-DFlash2 (reference drafter, {INCOAI_LICENCE}: non-commercial, no derivatives)",
            ("incoai",), licence=INCOAI_LICENCE,
            source="README 1M line; DFlash2-G card: incoai 9 GiB / 1,048,576 -> 1,360,420 (2,048-token sliding "
                   "window, ~7 KB/token)"),
)}


def get(name: str | None) -> Profile:
    """The named profile (None: the default). ValueError naming the known ones for anything else (``@profile:``:
    the config's error names the field)."""
    key = name or DEFAULT
    if key not in PROFILES:
        raise ValueError(f"@profile: unknown profile {key!r}; the card's profiles are {', '.join(PROFILES)} "
                         "(`sparkserve profiles`)")
    return PROFILES[key]


def apply(data: Any) -> Any:
    """The raw config mapping with the profile's value set wherever the config leaves the field out.

    Called on the config's data before it is validated; a field the user (or the environment) set is kept."""
    if not isinstance(data, dict):
        return data
    prof = get(data.get("profile"))  # ValueError: the config's error on `profile`
    out = dict(data)
    for path, value in prof.values().items():
        section, key = path.split(".")
        sub = out.get(section)
        if sub is None:
            sub = {}
        elif not isinstance(sub, dict):  # an already-built section (assignment): complete as it is
            continue
        if key not in sub:
            out[section] = {**sub, key: value}
    spec = out.get("speculative")
    if isinstance(spec, dict) and spec.get("method") == "mtp" and "drafter" not in out:
        out["drafter"] = None  # the target's own head: no drafter section needed (dflash still requires one)
    return out


def field_value(cfg: Any, path: str) -> Any:
    section, key = path.split(".")
    return getattr(getattr(cfg, section), key)


def overrides(cfg: Any) -> list[tuple[str, Any, Any]]:
    """(field, the profile's value, the config's) for every profile field the config sets otherwise."""
    prof = get(getattr(cfg, "profile", None))
    out = []
    for path, want in prof.values().items():
        have = field_value(cfg, path)
        if have != want:
            out.append((path, want, have))
    return out


#: The launcher's ``--shm-size 32g`` beside ``--ipc host`` (docker ignores it under host IPC; rendered as the card).
CARD_SHM_SIZE = 32 * GIB


def card_shm_size(cfg: Any) -> int | None:
    """``--shm-size`` of a rank's container: ``container.shm_size`` when set, else the card's 32g (docker only)."""
    if cfg.runtime != "docker":
        return None
    return int(cfg.container.shm_size) if cfg.container.shm_size is not None else CARD_SHM_SIZE


def uses_drafter(cfg: Any) -> bool:
    """Whether this config serves a drafter model (False: the target's built-in MTP head)."""
    return cfg.speculative.method != "mtp" and cfg.drafter is not None


#: The drafter digest of a stack with no drafter (mtp): the same on every node, so the identity gate compares it.
NO_DRAFTER = "none: mtp"


def drafter_path(cfg: Any) -> str | None:
    """The drafter's host path, or None when no drafter is served (mtp)."""
    return str(cfg.drafter.path) if uses_drafter(cfg) else None
