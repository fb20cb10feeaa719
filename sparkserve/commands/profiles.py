"""profiles — the model card's named serving profiles, and what this config changes in the one it uses."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from sparkserve.commands._common import ConfigOpt, JsonOpt, console, emit_json
from sparkserve.config import Config, find_config_path, load_config


def _gib(n: int) -> str:
    g = n / 2**30
    return f"{g:g} GiB" if g == int(g) else f"{g:.2f} GiB"


def _short(p: Any) -> str:
    if not p.uses_drafter:
        return "the target's own MTP head, no drafter"
    if p.licence:
        return f"the incoai reference drafter ({p.licence})"
    return "drafter " + " / ".join(f"-{x}" for x in reversed(p.validated_with))


def profile_view(cfg: Config) -> dict[str, Any]:
    """The config's profile and the fields it sets otherwise (`render --json`, `profiles --json`)."""
    from sparkserve.config import profiles

    prof = profiles.get(cfg.profile)
    return {"name": prof.name, "explicit": cfg.profile is not None,
            "overrides": [{"field": f, "profile": want, "config": have} for f, want, have in profiles.overrides(cfg)]}


def profiles_cmd(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The card's named profiles (`profile:` in the config): KV pin, max model length, GMU, pool gate, drafter.

    The config's own profile is marked; a field the config sets otherwise wins and is listed under the table."""
    from sparkserve.config import profiles

    cfg = load_config(config)
    source = str(find_config_path(config) or "the embedded default")
    active = profile_view(cfg)
    if as_json:
        emit_json({"profiles": [p.to_json() for p in profiles.PROFILES.values()], "config": source,
                   "active": active})
        return
    t = Table(title="the model card's profiles (canada-quant/vllm-glm53-flash-sm121)", title_justify="left")
    for col in ("profile", "max model len", "KV pin (bytes)", "GMU", "pool gate", "drafts"):
        t.add_column(col, overflow="fold")
    for p in profiles.PROFILES.values():
        mark = " *" if p.name == active["name"] else ""
        pool = f"{p.pool_tokens:,}" if p.pool_tokens else "banked"
        t.add_row(p.name + mark, f"{p.max_model_len:,}", f"{_gib(p.kv_cache_memory_bytes)} ({p.kv_cache_memory_bytes})",
                  f"{p.gpu_memory_utilization:g}", pool, f"{p.method} K={p.num_speculative_tokens}: {_short(p)}")
    console.print(t)
    console.print("pool gate: the card's measured `GPU KV cache size` for that pin; banked: the card has none, the "
                  "first passing boot's pool is banked (`up --bank`)", markup=False, highlight=False, soft_wrap=True)
    for p in profiles.PROFILES.values():
        if p.caveat:
            console.print(f"{p.name}: {p.caveat}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"* {source}: profile {active['name']}" + ("" if active["explicit"] else " (the default)"),
                  markup=False, highlight=False, soft_wrap=True)
    for o in active["overrides"]:
        console.print(f"  {o['field']}: {o['config']} (the profile's: {o['profile']}) — the config's value wins",
                      markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("profiles")(profiles_cmd)
