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

from sparkserve.journal.best_effort import fallback_candidates, fallback_note, lookup, record
from sparkserve.journal.history import HISTORY_KINDS, HistoryEntry, since_time
from sparkserve.journal.schema import MIGRATIONS, SCHEMA_VERSION, sha256_text
from sparkserve.journal.store import ENV_PATH, Journal, default_path

__all__ = [
    "ENV_PATH", "HISTORY_KINDS", "MIGRATIONS", "SCHEMA_VERSION", "HistoryEntry", "Journal", "default_path",
    "fallback_candidates", "fallback_note", "lookup", "record", "sha256_text", "since_time",
]
