"""The journal read back as one history: every kind of record as a :class:`HistoryEntry`, newest first."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sparkserve.journal.schema import sha256_text

HISTORY_KINDS = ("deployment", "gates", "pool", "bench", "campaign", "down", "smoke")

#: The outcome of the deployment row `down` writes (a row of its own: kind "down" in the history).
DOWN_OUTCOME = "taken down"

#: The bench cell name under which the gates' smoke run (`up`, `gates`) is recorded: kind "smoke", not "bench".
GATES_SMOKE_CELL = "smoke@gates"


def since_time(since: str, *, now: datetime | None = None) -> str:
    """``30m`` / ``2h`` / ``7d`` ago, or an ISO date or time, as the journal's ISO time (UTC) to compare
    with; ValueError on anything else."""
    from datetime import timedelta

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    s = since.strip()
    if s and s[-1] in units and s[:-1].replace(".", "", 1).isdigit():
        t = (now or datetime.now(UTC)) - timedelta(seconds=float(s[:-1]) * units[s[-1]])
    else:
        t = datetime.fromisoformat(s)
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class HistoryEntry:
    kind: str  # deployment | down | gates | smoke | pool | bench | campaign
    id: int | str
    time: str
    fingerprint: str | None
    summary: str
    ok: bool | None = None
    sha256_ok: bool | None = None  # bench rows: does the stored JSON still match its sha256?

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read(c: sqlite3.Connection, limit: int) -> list[HistoryEntry]:
    """The newest ``limit`` records of each kind, interleaved by time, newest first (raises on a damaged
    journal: the caller turns that into BadInput)."""
    out: list[HistoryEntry] = []
    for id_, t, fp, outcome, images, manifest in c.execute(
        "SELECT id, time, fingerprint, outcome, image_ids_json, drafter_manifest_sha256"
        " FROM deployments ORDER BY id DESC LIMIT ?", (limit,)
    ):
        ids = json.loads(images)
        distinct = sorted(set(ids.values()))
        img = ", ".join(_short(i) for i in distinct) or "?"
        drafter = _short(manifest) if manifest else "?"
        if outcome == DOWN_OUTCOME:  # `down` took this deployment down
            out.append(HistoryEntry("down", id_, t, fp, f"stopped and removed on {len(ids)} node(s): "
                                    f"{', '.join(sorted(ids))}"))
            continue
        out.append(HistoryEntry(
            "deployment", id_, t, fp, f"{outcome} on {len(ids)} node(s), image {img}, drafter {drafter}",
        ))
    for id_, t, fp, ok, verdicts in c.execute(
        "SELECT id, time, fingerprint, ok, verdicts_json FROM gate_runs ORDER BY id DESC LIMIT ?",
        (limit,),
    ):
        out.append(HistoryEntry("gates", id_, t, fp, _gates_summary(json.loads(verdicts)), ok=bool(ok)))
    for fp, tokens, t in c.execute(
        "SELECT fingerprint, pool_tokens, time FROM banked_pools ORDER BY time DESC LIMIT ?", (limit,)
    ):
        out.append(HistoryEntry("pool", fp[:12], t, fp, f"banked pool {tokens:,} tokens"))
    for id_, t, fp, cell, raw, sha in c.execute(
        "SELECT id, time, fingerprint, cell, result_json, sha256 FROM bench_results"
        " ORDER BY id DESC LIMIT ?",
        (limit,),
    ):
        sha_ok = sha256_text(raw) == sha
        if cell == GATES_SMOKE_CELL:  # the smoke gate's run (`up`, `gates`), not a `bench` command's
            out.append(HistoryEntry("smoke", id_, t, fp, "gates' " + _bench_summary("smoke", raw),
                                    ok=_bench_ok(raw), sha256_ok=sha_ok))
            continue
        out.append(HistoryEntry("bench", id_, t, fp, _bench_summary(cell, raw), ok=_bench_ok(raw),
                                sha256_ok=sha_ok))
    for id_, t, status, fp, spec in c.execute(
        "SELECT id, updated, status, config_sha256, spec_json FROM campaigns ORDER BY id DESC LIMIT ?", (limit,)
    ):
        waves = c.execute("SELECT COUNT(*), SUM(counted) FROM campaign_waves WHERE campaign_id = ?",
                          (id_,)).fetchone()
        names = ", ".join(a.get("name", "?") for a in json.loads(spec).get("drafters", []))
        out.append(HistoryEntry("campaign", id_, t, fp, f"A/B {names}: {status}, {waves[0]} waves "
                                f"({waves[1] or 0} counted); `sparkserve ab report {id_}`",
                                ok=None if status in ("running", "interrupted") else (
                                    status == "done" or status.startswith("stopped"))))
    out.sort(key=lambda e: e.time, reverse=True)
    return out[:limit]


def _short(s: str) -> str:
    s = s.removeprefix("sha256:")
    return s[:12]


def _gates_summary(v: Any) -> str:
    gates = v.get("gates", []) if isinstance(v, dict) else v if isinstance(v, list) else []
    failed = [g.get("name", "?") for g in gates if isinstance(g, dict) and not g.get("ok")]
    names = len(gates)
    return f"{names} gates, failed: {', '.join(failed)}" if failed else f"{names} gates passed"


def _bench_ok(raw: str) -> bool | None:
    try:
        v = json.loads(raw)
    except ValueError:
        return None
    return bool(v.get("ok", True)) if isinstance(v, dict) else None


def _bench_summary(cell: str, raw: str) -> str:
    try:
        v = json.loads(raw)
    except ValueError:
        return f"{cell}: unreadable result JSON"
    al = v.get("acceptance_length")
    al_s = f"AL {al:.2f}" if isinstance(al, int | float) else "AL n/a"
    proto = f" [{v['protocol']}]" if isinstance(v.get("protocol"), str) else ""  # issue 21: card | forced
    s = f"{cell}{proto}: {v.get('output_tok_s', 0):,.1f} tok/s, {al_s}, {v.get('stream_errors', '?')} stream errors"
    e2e = ((v.get("latency") or {}).get("e2e") or {}).get("median_ms") if isinstance(v.get("latency"), dict) else None
    if isinstance(e2e, int | float):  # issue 41: latency, the warm-up
        s += f", E2E p50 {e2e:,.0f} ms"
    warm = v.get("warmup")
    s += f", warm-up {warm.get('requests')}" if isinstance(warm, dict) else ""
    if v.get("refused"):
        s += f" — refused: {v['refused'][0]}"
    return s
