"""Versioned migrations for the PostgreSQL read model: projections/migrations/NNNN_*.sql, applied in
order, each in its own transaction, under an advisory lock so concurrent starters don't race."""

from __future__ import annotations

from importlib.resources import files

import psycopg

LOCK_ID = 0x7A5C  # pg_advisory_xact_lock key for migrations


def migrations() -> list[tuple[int, str, str]]:
    out = []
    for item in files("taskstream.projections").joinpath("migrations").iterdir():
        if item.name.endswith(".sql"):
            out.append((int(item.name.split("_", 1)[0]), item.name, item.read_text()))
    return sorted(out)


def migrate(dsn: str) -> list[str]:
    """Apply what is missing; returns the names applied."""
    applied: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, name, sql in migrations():
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
                if conn.execute("SELECT 1 FROM schema_migrations WHERE version = %s", (version,)).fetchone():
                    continue
                conn.execute(sql.encode())  # a trusted file shipped with the package
                conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
                applied.append(name)
    return applied
