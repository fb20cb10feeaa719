"""The journal's store: one SQLite connection (:class:`Journal`), its path, and a method per record kind."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from types import TracebackType
from typing import Any

from platformdirs import user_state_dir

from sparkserve.errors import BadInput
from sparkserve.journal import history
from sparkserve.journal.history import HistoryEntry
from sparkserve.journal.schema import MIGRATIONS, SCHEMA_VERSION, now, sha256_text

ENV_PATH = "SSJOURNAL_PATH"  # not SPARKSERVE_*: that prefix is for config overrides


def default_path() -> Path:
    env = os.environ.get(ENV_PATH)
    if env:
        return Path(env).expanduser()
    return Path(user_state_dir("sparkserve")) / "journal.sqlite"


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
            (now(), fingerprint, sha256_text(config_json), config_json,
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
            " deployments WHERE fingerprint LIKE ? AND outcome != ? ORDER BY id DESC LIMIT 1",
            (fingerprint + "%", history.DOWN_OUTCOME)).fetchone()
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
            (deployment_id, fingerprint, now(), int(ok), json.dumps(verdicts, sort_keys=True, default=str),
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
            (fingerprint, int(pool_tokens), now()),
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
            (fingerprint, cell, now(), result_json, sha256_text(result_json)),
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
        t = now()
        return self._write(
            "INSERT INTO campaigns (time, updated, status, config_sha256, spec_json, sha256)"
            " VALUES (?, ?, 'running', ?, ?, ?)",
            (t, t, config_sha256, spec_json, sha256_text(spec_json)),
        )

    def set_campaign_status(self, campaign_id: int, status: str) -> None:
        self._write("UPDATE campaigns SET status = ?, updated = ? WHERE id = ?", (status, now(), campaign_id))

    def campaign(self, campaign_id: int) -> tuple[str, str, bool] | None:
        """``(status, spec_json, sha256_ok)`` of a campaign, None when there is none with this id."""
        row = self._conn.execute(
            "SELECT status, spec_json, sha256 FROM campaigns WHERE id = ?", (campaign_id,)
        ).fetchone()
        return (row[0], row[1], sha256_text(row[1]) == row[2]) if row else None

    def record_campaign_boot(self, campaign_id: int, slot: int, ok: bool, boot_json: str) -> int:
        return self._write(
            "INSERT INTO campaign_boots (campaign_id, slot, time, ok, boot_json) VALUES (?, ?, ?, ?, ?)",
            (campaign_id, slot, now(), int(ok), boot_json),
        )

    def update_campaign_boot(self, boot_row: int, ok: bool, boot_json: str) -> None:
        self._write("UPDATE campaign_boots SET ok = ?, boot_json = ? WHERE id = ?", (int(ok), boot_json, boot_row))

    def record_campaign_wave(self, campaign_id: int, boot_row: int, slot: int, cell: str, counted: bool,
                             wave_json: str) -> int:
        """Store the wave exactly as given, with the sha256 of that text."""
        return self._write(
            "INSERT INTO campaign_waves (campaign_id, boot_row, slot, cell, time, counted, wave_json, sha256)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (campaign_id, boot_row, slot, cell, now(), int(counted), wave_json, sha256_text(wave_json)),
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
            " VALUES (?, ?, ?, ?, ?)", (config_sha256, now(), drafter_path, drafter_source, digest))

    def active_drafter(self, config_sha256: str) -> dict[str, str] | None:
        """The drafter `swap-drafter --no-write` left serving for this config: path, source, digest, time."""
        row = self._conn.execute("SELECT drafter_path, drafter_source, digest, time FROM active_drafters"
                                 " WHERE config_sha256 = ?", (config_sha256,)).fetchone()
        return None if row is None else {"path": row[0], "source": row[1], "digest": row[2], "time": row[3]}

    def clear_active_drafter(self, config_sha256: str) -> int:
        return self._write("DELETE FROM active_drafters WHERE config_sha256 = ?", (config_sha256,))

    # -- host fingerprints (doctor --drift) -------------------------------------------------------

    def record_host_facts(self, fingerprint: str, gates_passed: bool, hosts: dict[str, Any]) -> int:
        """Every node's host fingerprint at one boot of the deployment ``fingerprint``."""
        return self._write("INSERT INTO host_facts (time, fingerprint, gates_passed, hosts_json) VALUES (?, ?, ?, ?)",
                           (now(), fingerprint, int(gates_passed), json.dumps(hosts, sort_keys=True)))

    def last_good_host_facts(self) -> dict[str, Any] | None:
        """The newest boot whose gates passed: time, deployment fingerprint, and each node's host fingerprint."""
        row = self._conn.execute("SELECT time, fingerprint, hosts_json FROM host_facts WHERE gates_passed = 1 "
                                 "ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else {"time": row[0], "fingerprint": row[1], "hosts": json.loads(row[2])}

    # -- supervise (incidents, recoveries, give-ups, banked acceptance bands) ----------------------

    def record_supervise_event(self, fingerprint: str | None, event: str, event_json: str) -> int:
        """``event``: incident, recovered, restart_failed, gave_up or band (the row's ``kind``)."""
        return self._write(
            "INSERT INTO supervise_events (time, fingerprint, kind, event_json, sha256) VALUES (?, ?, ?, ?, ?)",
            (now(), fingerprint, event, event_json, sha256_text(event_json)))

    def supervise_events(self, fingerprint: str | None = None, kind: str | None = None,
                         limit: int = 50) -> list[tuple[int, str, str, str]]:
        """``(id, time, kind, event_json)``, newest first, of one deployment and/or kind."""
        sql, args = "SELECT id, time, kind, event_json FROM supervise_events WHERE 1=1", []
        if fingerprint is not None:
            sql, args = sql + " AND fingerprint = ?", [*args, fingerprint]
        if kind is not None:
            sql, args = sql + " AND kind = ?", [*args, kind]
        rows = self._conn.execute(sql + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [(int(a), b, c, d) for a, b, c, d in rows]

    def bench_results_for(self, fingerprint: str, limit: int = 20) -> list[tuple[int, str, str]]:
        """``(id, cell, result_json)`` of the bench results of one deployment, newest first."""
        rows = self._conn.execute("SELECT id, cell, result_json FROM bench_results WHERE fingerprint = ? "
                                  "ORDER BY id DESC LIMIT ?", (fingerprint, limit)).fetchall()
        return [(int(a), b, c) for a, b, c in rows]


    def history(self, limit: int = 50) -> list[HistoryEntry]:
        """Newest first, every kind of record interleaved by time. BadInput when the journal is damaged
        (a page or a stored JSON value unreadable)."""
        try:
            return history.read(self._conn, limit)
        except (sqlite3.DatabaseError, ValueError, TypeError, AttributeError) as e:
            raise BadInput(str(self.path), f"the journal is damaged ({e})") from None

    def history_where(self, limit: int = 50, *, kinds: list[str] | None = None,
                      since: str | None = None) -> list[HistoryEntry]:
        """:meth:`history`, only entries of ``kinds`` (deployment, gates, pool, bench, campaign) recorded at
        or after ``since`` (an ISO time, as :func:`since_time` gives), newest ``limit`` of those."""
        try:
            entries = history.read(self._conn, 1 << 31)
        except (sqlite3.DatabaseError, ValueError, TypeError, AttributeError) as e:
            raise BadInput(str(self.path), f"the journal is damaged ({e})") from None
        picked = [e for e in entries if (not kinds or e.kind in kinds) and (since is None or e.time >= since)]
        return picked[:limit]
