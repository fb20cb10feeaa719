"""The journal's SQLite schema: one migration per version (``PRAGMA user_version``), applied forward on open."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

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
    """
    CREATE TABLE supervise_events (           -- `supervise`: incidents, recoveries, give-ups, acceptance bands
        id INTEGER PRIMARY KEY,
        time TEXT NOT NULL,
        fingerprint TEXT,                     -- the deployment it watched
        kind TEXT NOT NULL,                   -- incident | recovered | gave_up | band
        event_json TEXT NOT NULL,
        sha256 TEXT NOT NULL                  -- of event_json exactly as stored
    );
    CREATE INDEX supervise_events_fp ON supervise_events(fingerprint, kind);
    """,
    """
    CREATE TABLE host_facts (                 -- `up`: every node's host fingerprint at each boot (`doctor --drift`)
        id INTEGER PRIMARY KEY,
        time TEXT NOT NULL,
        fingerprint TEXT NOT NULL,            -- the deployment that booted
        gates_passed INTEGER NOT NULL,        -- 1: the boot's gates passed (a reference for drift)
        hosts_json TEXT NOT NULL              -- {node: nodes.hostfacts.HostFacts.fingerprint()}
    );
    CREATE INDEX host_facts_good ON host_facts(gates_passed, id);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def now() -> str:
    """A row's time: UTC, ISO 8601 with microseconds (sorts as text)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def sha256_text(text: str) -> str:
    """The digest stored beside a JSON value, so a changed value is seen when read back."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
