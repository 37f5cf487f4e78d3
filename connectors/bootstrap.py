"""One-time, idempotent set-up of a stack: topics, registered schemas, database migrations."""

from __future__ import annotations

import logging

from taskstream.connectors.kafka import ensure_topics, register_schemas
from taskstream.projections.migrate import migrate

from taskstream.settings import Settings

log = logging.getLogger(__name__)


def bootstrap(settings: Settings) -> None:
    ensure_topics(settings)
    ids = register_schemas(settings)
    applied = migrate(settings.dsn)
    log.info("bootstrap: topics ensured, schema ids %s, migrations applied %s", ids, applied or "none")
