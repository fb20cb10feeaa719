"""The journal: what ran, with sha256 pins — deployments, gate runs, banked pools, bench results.

Example::

    with Journal.open() as j:                  # $SSJOURNAL_PATH, else <user state dir>/journal.sqlite
        dep = j.record_deployment(fingerprint, config_json, {"spark-a": "sha256:…"}, manifest_sha, "up")
        j.put_banked_pool(fingerprint, 366749)
        j.get_banked_pool(fingerprint)         # 366749
        j.record_bench(fingerprint, "smoke", result.to_json())
        j.history(limit=20)

SQLite in WAL mode; the schema is versioned with ``PRAGMA user_version`` and migrated forward on open.
Each write is one transaction, so a crash mid-run leaves the journal as it was before that write.

The journal is a record, not a gate: deploys write through :func:`record` and read through :func:`lookup`,
which never fail their caller. When the journal cannot be used (corrupt, full, read-only), they print one
``warning: journal: …`` line (once per process) and append each record as a JSON line to a fallback file
(:func:`fallback_candidates`: next to the journal, else in the temp dir)::

    record("gate_run", fingerprint=fp, ok=True, verdicts=report, boot_id=boot)
    banked = lookup(lambda j: j.get_banked_pool(fp), None)
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from platformdirs import user_state_dir

from sparkserve.errors import BadInput

ENV_PATH = "SSJOURNAL_PATH"  # not SPARKSERVE_*: that prefix is for config overrides

# Each entry moves the schema from version i to i + 1. Append only; never edit a shipped migration.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE deployments (
        id INTEGER PRIMARY KEY,
        time TEXT NOT NULL,
        fingerprint TEXT NOT NULL,            -- sha256 of normalized config + image IDs + drafter manifest
        config_sha256 TEXT NOT NULL,          -- sha256 of the normalized config alone (Config.fingerprint())
        config_json TEXT NOT NULL,
        image_ids_json TEXT NOT NULL,         -- {"node": "sha256:…"}
        drafter_manifest_sha256 TEXT,
        outcome TEXT NOT NULL                 -- e.g. started, up, failed, rolled-back, down
    );
    CREATE INDEX deployments_fingerprint ON deployments(fingerprint);
    CREATE INDEX deployments_config ON deployments(config_sha256);
    CREATE TABLE gate_runs (
        id INTEGER PRIMARY KEY,
        deployment_id INTEGER REFERENCES deployments(id),
        fingerprint TEXT NOT NULL,
        time TEXT NOT NULL,
        ok INTEGER NOT NULL,
        verdicts_json TEXT NOT NULL
    );
    CREATE INDEX gate_runs_fingerprint ON gate_runs(fingerprint);
    CREATE TABLE banked_pools (
        fingerprint TEXT PRIMARY KEY,
        pool_tokens INTEGER NOT NULL,
        time TEXT NOT NULL
    );
    CREATE TABLE bench_results (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT,
        cell TEXT NOT NULL,
        time TEXT NOT NULL,
        result_json TEXT NOT NULL,
        sha256 TEXT NOT NULL                  -- of result_json exactly as printed
    );
    CREATE INDEX bench_results_fingerprint ON bench_results(fingerprint);
    """,
    """
    ALTER TABLE gate_runs ADD COLUMN boot_id TEXT;  -- which boot of the deployment was judged (see gate_verdict)
    CREATE INDEX gate_runs_boot ON gate_runs(fingerprint, boot_id);
    """,
    """
    CREATE TABLE campaigns (                  -- `ab run`: one A/B campaign (measure/ab_records.CampaignSpec)
        id INTEGER PRIMARY KEY,
        time TEXT NOT NULL,
        updated TEXT NOT NULL,
        status TEXT NOT NULL,                 -- running | interrupted | failed | done
        config_sha256 TEXT NOT NULL,
        spec_json TEXT NOT NULL,
        sha256 TEXT NOT NULL                  -- of spec_json exactly as stored
    );
    CREATE TABLE campaign_boots (             -- one boot of one drafter, counted or excluded
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        slot INTEGER NOT NULL,
        time TEXT NOT NULL,
        ok INTEGER NOT NULL,
        boot_json TEXT NOT NULL
    );
    CREATE INDEX campaign_boots_campaign ON campaign_boots(campaign_id);
    CREATE TABLE campaign_waves (             -- one cell on one boot: bench record, per-request samples, pins
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        boot_row INTEGER NOT NULL REFERENCES campaign_boots(id),
        slot INTEGER NOT NULL,
        cell TEXT NOT NULL,
        time TEXT NOT NULL,
        counted INTEGER NOT NULL,
        wave_json TEXT NOT NULL,
        sha256 TEXT NOT NULL                  -- of wave_json exactly as stored
    );
    CREATE INDEX campaign_waves_campaign ON campaign_waves(campaign_id);
    """,
    """
    CREATE TABLE active_drafters (            -- `swap-drafter --no-write`: the drafter `up` keeps for a config
        config_sha256 TEXT PRIMARY KEY,       -- Config.fingerprint() of the config file as written
        time TEXT NOT NULL,
        drafter_path TEXT NOT NULL,           -- on every node
        drafter_source TEXT,                  -- this machine's copy it was synced from
        digest TEXT NOT NULL                  -- its manifest sha256
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def default_path() -> Path:
    env = os.environ.get(ENV_PATH)
    if env:
        return Path(env).expanduser()
    return Path(user_state_dir("sparkserve")) / "journal.sqlite"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


HISTORY_KINDS = ("deployment", "gates", "pool", "bench", "campaign")


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


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class HistoryEntry:
    kind: str  # deployment | gates | pool | bench | campaign
    id: int | str
    time: str
    fingerprint: str | None
    summary: str
    ok: bool | None = None
    sha256_ok: bool | None = None  # bench rows: does the stored JSON still match its sha256?

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Journal:
    """One SQLite connection to the journal. Use :meth:`open` (creates and migrates) as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path | None = None) -> Journal:
        path = path or default_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)  # explicit transactions
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            j = cls(conn, path)
            j._migrate()
        except sqlite3.DatabaseError as e:
            raise BadInput(str(path), f"damaged: not a usable sparkserve journal ({e})") from e
        except OSError as e:
            raise BadInput(str(path), f"cannot open the journal ({e.strerror or e})") from e
        return j

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- schema -----------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")  # one migrator at a time; version read inside the lock
        try:
            version = self.schema_version
            if version > SCHEMA_VERSION:
                raise BadInput(
                    str(self.path),
                    f"journal schema {version} is newer than this sparkserve's ({SCHEMA_VERSION}); upgrade",
                )
            for v in range(version, SCHEMA_VERSION):
                for stmt in MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        self._conn.execute(stmt)
                self._conn.execute(f"PRAGMA user_version = {v + 1}")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        """One statement in its own transaction; returns the new row id."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            cur = self._conn.execute(sql, args)
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return int(cur.lastrowid or 0)

    # -- deployments ------------------------------------------------------------------------------

    def record_deployment(
        self,
        fingerprint: str,
        config: dict[str, Any],
        image_ids: dict[str, str],
        drafter_manifest_sha256: str | None,
        outcome: str,
    ) -> int:
        """``config`` is the normalized config (``Config.normalized()``)."""
        config_json = json.dumps(config, sort_keys=True, separators=(",", ":"))
        return self._write(
            "INSERT INTO deployments (time, fingerprint, config_sha256, config_json, image_ids_json,"
            " drafter_manifest_sha256, outcome) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (_now(), fingerprint, sha256_text(config_json), config_json,
             json.dumps(image_ids, sort_keys=True), drafter_manifest_sha256, outcome),
        )

    def set_deployment_outcome(self, deployment_id: int, outcome: str) -> None:
        self._write("UPDATE deployments SET outcome = ? WHERE id = ?", (outcome, deployment_id))

    def latest_fingerprint_for_config(self, config_sha256: str) -> str | None:
        """The full fingerprint of the newest deployment of this config (``Config.fingerprint()``)."""
        row = self._conn.execute(
            "SELECT fingerprint FROM deployments WHERE config_sha256 = ? ORDER BY id DESC LIMIT 1",
            (config_sha256,),
        ).fetchone()
        return row[0] if row else None

    def deployment(self, fingerprint: str) -> dict[str, Any] | None:
        """The newest deployment recorded with this fingerprint (full or a prefix of ≥ 12): time, config,
        image IDs, drafter manifest digest, outcome."""
        row = self._conn.execute(
            "SELECT time, fingerprint, config_json, image_ids_json, drafter_manifest_sha256, outcome FROM"
            " deployments WHERE fingerprint LIKE ? ORDER BY id DESC LIMIT 1", (fingerprint + "%",)).fetchone()
        if row is None:
            return None
        return {"time": row[0], "fingerprint": row[1], "config": json.loads(row[2]),
                "image_ids": json.loads(row[3]), "drafter_digest": row[4], "outcome": row[5]}

    # -- gates and pools --------------------------------------------------------------------------

    def record_gate_run(
        self, fingerprint: str, ok: bool, verdicts: Any, *, deployment_id: int | None = None,
        boot_id: str | None = None,
    ) -> int:
        """``verdicts`` is the ``gates --json`` object (or its ``gates`` list); ``boot_id`` names the boot
        that was judged (None: not a full judgement, e.g. some gates skipped)."""
        return self._write(
            "INSERT INTO gate_runs (deployment_id, fingerprint, time, ok, verdicts_json, boot_id)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (deployment_id, fingerprint, _now(), int(ok), json.dumps(verdicts, sort_keys=True, default=str),
             boot_id),
        )

    def gate_verdict(self, fingerprint: str, boot_id: str) -> bool | None:
        """The newest gate verdict for this boot of this deployment (None: never judged). A boot id
        changes whenever a container is replaced or restarted, so an old pass never vouches for a new boot."""
        row = self._conn.execute(
            "SELECT ok FROM gate_runs WHERE fingerprint = ? AND boot_id = ? ORDER BY id DESC LIMIT 1",
            (fingerprint, boot_id),
        ).fetchone()
        return bool(row[0]) if row else None

    def put_banked_pool(self, fingerprint: str, pool_tokens: int) -> None:
        self._write(
            "INSERT INTO banked_pools (fingerprint, pool_tokens, time) VALUES (?, ?, ?)"
            " ON CONFLICT(fingerprint) DO UPDATE"
            " SET pool_tokens = excluded.pool_tokens, time = excluded.time",
            (fingerprint, int(pool_tokens), _now()),
        )

    def get_banked_pool(self, fingerprint: str) -> int | None:
        row = self._conn.execute(
            "SELECT pool_tokens FROM banked_pools WHERE fingerprint = ?", (fingerprint,)
        ).fetchone()
        return int(row[0]) if row else None

    # -- bench ------------------------------------------------------------------------------------

    def record_bench(self, fingerprint: str | None, cell: str, result_json: str) -> int:
        """Store the result exactly as printed, with the sha256 of that text."""
        return self._write(
            "INSERT INTO bench_results (fingerprint, cell, time, result_json, sha256) VALUES (?, ?, ?, ?, ?)",
            (fingerprint, cell, _now(), result_json, sha256_text(result_json)),
        )

    def bench_result(self, bench_id: int) -> tuple[str, str] | None:
        """``(result_json, sha256)`` as stored."""
        row = self._conn.execute(
            "SELECT result_json, sha256 FROM bench_results WHERE id = ?", (bench_id,)
        ).fetchone()
        return (row[0], row[1]) if row else None

    # -- A/B campaigns (`ab run`, `ab report`) ----------------------------------------------------
    # Rows hold the JSON of measure/ab_records (CampaignSpec, Boot, Wave); the journal does not read inside
    # them beyond what it indexes, so the records can grow fields without a migration.

    def create_campaign(self, config_sha256: str, spec_json: str) -> int:
        now = _now()
        return self._write(
            "INSERT INTO campaigns (time, updated, status, config_sha256, spec_json, sha256)"
            " VALUES (?, ?, 'running', ?, ?, ?)",
            (now, now, config_sha256, spec_json, sha256_text(spec_json)),
        )

    def set_campaign_status(self, campaign_id: int, status: str) -> None:
        self._write("UPDATE campaigns SET status = ?, updated = ? WHERE id = ?", (status, _now(), campaign_id))

    def campaign(self, campaign_id: int) -> tuple[str, str, bool] | None:
        """``(status, spec_json, sha256_ok)`` of a campaign, None when there is none with this id."""
        row = self._conn.execute(
            "SELECT status, spec_json, sha256 FROM campaigns WHERE id = ?", (campaign_id,)
        ).fetchone()
        return (row[0], row[1], sha256_text(row[1]) == row[2]) if row else None

    def record_campaign_boot(self, campaign_id: int, slot: int, ok: bool, boot_json: str) -> int:
        return self._write(
            "INSERT INTO campaign_boots (campaign_id, slot, time, ok, boot_json) VALUES (?, ?, ?, ?, ?)",
            (campaign_id, slot, _now(), int(ok), boot_json),
        )

    def update_campaign_boot(self, boot_row: int, ok: bool, boot_json: str) -> None:
        self._write("UPDATE campaign_boots SET ok = ?, boot_json = ? WHERE id = ?", (int(ok), boot_json, boot_row))

    def record_campaign_wave(self, campaign_id: int, boot_row: int, slot: int, cell: str, counted: bool,
                             wave_json: str) -> int:
        """Store the wave exactly as given, with the sha256 of that text."""
        return self._write(
            "INSERT INTO campaign_waves (campaign_id, boot_row, slot, cell, time, counted, wave_json, sha256)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (campaign_id, boot_row, slot, cell, _now(), int(counted), wave_json, sha256_text(wave_json)),
        )

    def campaign_boots(self, campaign_id: int) -> list[tuple[int, str]]:
        """``(row id, boot_json)`` in the order they were recorded."""
        return [(int(i), j) for i, j in self._conn.execute(
            "SELECT id, boot_json FROM campaign_boots WHERE campaign_id = ? ORDER BY id", (campaign_id,))]

    def campaign_waves(self, campaign_id: int) -> list[tuple[int, str, bool]]:
        """``(row id, wave_json, sha256_ok)`` in the order they were recorded."""
        return [(int(i), j, sha256_text(j) == h) for i, j, h in self._conn.execute(
            "SELECT id, wave_json, sha256 FROM campaign_waves WHERE campaign_id = ? ORDER BY id", (campaign_id,))]

    # -- the active drafter (swap-drafter --no-write) ---------------------------------------------

    def set_active_drafter(self, config_sha256: str, drafter_path: str, drafter_source: str | None,
                           digest: str) -> int:
        return self._write(
            "INSERT OR REPLACE INTO active_drafters (config_sha256, time, drafter_path, drafter_source, digest)"
            " VALUES (?, ?, ?, ?, ?)", (config_sha256, _now(), drafter_path, drafter_source, digest))

    def active_drafter(self, config_sha256: str) -> dict[str, str] | None:
        """The drafter `swap-drafter --no-write` left serving for this config: path, source, digest, time."""
        row = self._conn.execute("SELECT drafter_path, drafter_source, digest, time FROM active_drafters"
                                 " WHERE config_sha256 = ?", (config_sha256,)).fetchone()
        return None if row is None else {"path": row[0], "source": row[1], "digest": row[2], "time": row[3]}

    def clear_active_drafter(self, config_sha256: str) -> int:
        return self._write("DELETE FROM active_drafters WHERE config_sha256 = ?", (config_sha256,))

    # -- history ----------------------------------------------------------------------------------

    def history(self, limit: int = 50) -> list[HistoryEntry]:
        """Newest first, every kind of record interleaved by time. BadInput when the journal is damaged
        (a page or a stored JSON value unreadable)."""
        try:
            return self._history(limit)
        except (sqlite3.DatabaseError, ValueError, TypeError, AttributeError) as e:
            raise BadInput(str(self.path), f"the journal is damaged ({e})") from None

    def history_where(self, limit: int = 50, *, kinds: list[str] | None = None,
                      since: str | None = None) -> list[HistoryEntry]:
        """:meth:`history`, only entries of ``kinds`` (deployment, gates, pool, bench, campaign) recorded at
        or after ``since`` (an ISO time, as :func:`since_time` gives), newest ``limit`` of those."""
        try:
            entries = self._history(1 << 31)
        except (sqlite3.DatabaseError, ValueError, TypeError, AttributeError) as e:
            raise BadInput(str(self.path), f"the journal is damaged ({e})") from None
        picked = [e for e in entries if (not kinds or e.kind in kinds) and (since is None or e.time >= since)]
        return picked[:limit]

    def _history(self, limit: int) -> list[HistoryEntry]:
        c = self._conn
        out: list[HistoryEntry] = []
        for id_, t, fp, outcome, images, manifest in c.execute(
            "SELECT id, time, fingerprint, outcome, image_ids_json, drafter_manifest_sha256"
            " FROM deployments ORDER BY id DESC LIMIT ?", (limit,)
        ):
            ids = json.loads(images)
            distinct = sorted(set(ids.values()))
            img = ", ".join(_short(i) for i in distinct) or "?"
            drafter = _short(manifest) if manifest else "?"
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
                                    ok=None if status in ("running", "interrupted") else status == "done"))
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
    s = f"{cell}: {v.get('output_tok_s', 0):,.1f} tok/s, {al_s}, {v.get('stream_errors', '?')} stream errors"
    if v.get("refused"):
        s += f" — refused: {v['refused'][0]}"
    return s


# -- best effort: the journal never fails a deploy ----------------------------------------------------------

FALLBACK_SUFFIX = ".fallback.jsonl"
T = TypeVar("T")
_WRITERS: dict[str, Callable[..., Any]] = {
    "deployment": Journal.record_deployment,
    "gate_run": Journal.record_gate_run,
    "banked_pool": Journal.put_banked_pool,
    "bench": Journal.record_bench,
    "active_drafter": Journal.set_active_drafter,
    "clear_active_drafter": Journal.clear_active_drafter,
}
_warned: set[Path] = set()  # journals already warned about in this process: one line each


def fallback_candidates(path: Path) -> list[Path]:
    """Where records go when the journal at ``path`` cannot take them, in order of preference: next to it,
    else in the temp dir (the journal's own dir may be the read-only or full one)."""
    tmp = Path(tempfile.gettempdir()) / f"sparkserve-{os.getuid()}-journal{FALLBACK_SUFFIX}"
    return [path.with_name(path.name + FALLBACK_SUFFIX), tmp]


def fallback_note(path: Path) -> str:
    """``; records it could not take are in …`` when a fallback file holds records, else nothing."""
    held = [p for p in fallback_candidates(path) if p.is_file()]
    return f"; records it could not take are in {', '.join(map(str, held))}" if held else ""


def _warn_once(path: Path, err: BaseException, where: Path | None) -> None:
    if path in _warned:
        return
    _warned.add(path)
    what = err.what if isinstance(err, BadInput) else (getattr(err, "strerror", None) or str(err))
    dest = f"records go to {where}" if where else "records are lost (no writable fallback file)"
    print(f"warning: journal: {path}: {what}; {dest}", file=sys.stderr)


def _append_fallback(path: Path, line: dict[str, Any]) -> Path | None:
    """Append one JSON line to the first fallback file that takes it (created 0600, never through a
    symlink: the temp dir is shared); None when none does."""
    text = json.dumps(line, sort_keys=True, default=str) + "\n"
    for cand in fallback_candidates(path):
        try:
            fd = os.open(cand, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            os.write(fd, text.encode())
            return cand
        except OSError:
            continue
        finally:
            os.close(fd)
    return None


def record(kind: str, **fields: Any) -> Any:
    """Write one record (``kind``: deployment, gate_run, banked_pool, bench; ``fields``: that
    ``Journal`` method's arguments) to the journal and return what that method returns (a bench's id), or,
    when it cannot take it, write it to the fallback file with one warning and return None. Never raises:
    a deploy or a bench that works must not fail, or be torn down, over its record."""
    path = default_path()
    try:
        with Journal.open(path) as j:
            return _WRITERS[kind](j, **fields)
    except (BadInput, sqlite3.Error, OSError) as e:
        err: BaseException = e
    where = _append_fallback(path, {"kind": kind, "time": _now(), "journal": str(path), "error": str(err),
                                    **fields})
    _warn_once(path, err, where)


def lookup(read: Callable[[Journal], T], default: T) -> T:
    """``read(journal)``, or ``default`` (with the one warning) when the journal cannot be read."""
    path = default_path()
    try:
        with Journal.open(path) as j:
            return read(j)
    except (BadInput, sqlite3.Error, OSError) as e:
        _warn_once(path, e, next((p for p in fallback_candidates(path) if _writable(p)), None))
        return default


def _writable(p: Path) -> bool:
    """Whether a fallback file could be appended at ``p`` (for the warning of a failed read)."""
    return os.access(p, os.W_OK) if p.exists() else os.access(p.parent, os.W_OK)
