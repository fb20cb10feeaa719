"""Pre-flight rules of the card's profiles: what a config changed in its profile, and which drafter it serves.

``validate`` calls :func:`check_profile` with the config rules and :func:`check_identity` once the drafter is
read. Each profile names the drafters the card validated it with (sparkserve.profiles); a drafter the card never
ran that profile with is a warning, not an error — it may well work, but the card's pool and acceptance were not
measured with it (800K with -E, 1M with -G: a 9 GiB pin holds ≈450K tokens with E/F/G's full attention).
"""

from __future__ import annotations

from typing import Protocol

from sparkserve.config import Config, profiles
from sparkserve.config.profiles import uses_drafter  # noqa: F401 - validate: profile_checks.uses_drafter
from sparkserve.models.drafter import DrafterFacts
from sparkserve.models.drafter_identity import DrafterIdentity, identify


class Report(Protocol):  # what the checks below use of plan.findings.Report
    def warn(self, where: str, what: str) -> None: ...


def check_profile(cfg: Config, r: Report) -> None:
    """The fields the config sets otherwise than its profile (they win, and are said), and a drafter an MTP
    config would leave unused."""
    prof = profiles.get(cfg.profile)
    if prof.caveat or cfg.speculative.method == "mtp":  # the profile, or mtp set by hand on another one
        r.warn("profile", f"{prof.name if prof.caveat else 'speculative.method mtp'}: "
               f"{prof.caveat or profiles.MTP_CAVEAT}")
    for path, want, have in profiles.overrides(cfg):
        r.warn(path, f"{have} overrides profile {prof.name}'s {want} (the card's value); delete the line to "
               "serve the profile as the card validated it")
    if cfg.speculative.method == "mtp" and cfg.drafter is not None:
        r.warn("drafter.path", f"{cfg.drafter.path} is not served: speculative.method mtp uses the target's "
               "built-in MTP head (no drafter mount, no drafter sync)")


def check_identity(cfg: Config, d: DrafterFacts, r: Report, name_hint: str | None = None) -> DrafterIdentity:
    """Name the card's drafter ``d`` is (``name_hint``: the configured path, whose name may say the release when
    ``d`` was read from a copy), and warn when the profile was never validated with it."""
    ident = identify(d, name_hint=name_hint)
    prof = profiles.get(cfg.profile)
    if ident.licence:
        r.warn("drafter.path", f"{ident.name}: licence {ident.licence} (non-commercial use, no derivatives)")
    if not prof.uses_drafter:
        return ident
    seen = ident.release or ("E/F/G" if ident.family == "E/F/G" else None)
    valid = prof.validated_with
    if seen is None:  # not one of the card's: the card says nothing about it (validate names it, no warning)
        return ident
    if seen == "E/F/G" and set(valid) != {"E", "F", "G"}:
        r.warn("drafter.path", f"{ident.name}: profile {prof.name} was validated with {_names(valid)} only; name "
               "the release in the directory (…-DFlash2-G) or check it is that one")
    elif seen != "E/F/G" and seen not in valid:
        r.warn("drafter.path", f"the card never validated profile {prof.name} with {ident.name}: only with "
               f"{_names(valid)} (its pool {prof.pool_tokens or '—'} and acceptance were measured with that)")
    return ident


def _names(releases: tuple[str, ...]) -> str:
    return ", ".join("the incoai reference" if x == "incoai" else f"-{x}" for x in releases) or "no drafter"
