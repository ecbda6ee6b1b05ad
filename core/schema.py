"""The database schema as SQLAlchemy metadata.

Alembic revisions in ``migrations/`` own the real DDL; this module mirrors the
head revision so that tests can check the two agree and readers can find
every table in one place.  Hot-path SQL lives in :mod:`core.sql`.
"""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

metadata = MetaData()

# One row: the last committed position and its time.  Every commit moves it
# under its row lock, which makes commit order = position order (gapless).
# ``last_commit``: the token of the fast commit that moved it last, which a
# commit at planned positions checks before following it (migration 0011).
log_head = Table(
    "log_head",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("last_position", BigInteger, nullable=False),
    Column("last_recorded_at", DateTime(timezone=True), nullable=False),
    Column("last_commit", UUID(as_uuid=True), nullable=True),
)

events = Table(
    "events",
    metadata,
    Column("position", BigInteger, primary_key=True),
    Column("event_id", UUID(as_uuid=True), nullable=False),
    Column("context", Text, nullable=False),
    Column("stream", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("type", Text, nullable=False),
    Column("headers", JSONB, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("content_type", Text, nullable=False),
    Column("client_time", DateTime(timezone=True)),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("origin", Text, nullable=False),
    Column("segment_offset", BigInteger, nullable=False),
    # What each index serves: docs/architecture.md, "Indexes on events".
    UniqueConstraint("context", "stream", "version", name="events_stream_version_key"),
    # Idempotency keys are each tenant's own (migration 0008).
    UniqueConstraint("context", "event_id", name="events_context_event_id_key"),
    # Segment offsets and times have no index of their own (migration 0009):
    # reads bisect the version key and the primary key for them.
)

streams = Table(
    "streams",
    metadata,
    Column("context", Text, primary_key=True),
    Column("stream", Text, primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# Exactly-once appends (segment wire): highest offset stored per producer and
# stream, written in the same transaction as the events.
producer_checkpoints = Table(
    "producer_checkpoints",
    metadata,
    Column("producer_id", UUID(as_uuid=True), primary_key=True),
    Column("context", Text, primary_key=True),
    Column("stream", Text, primary_key=True),
    Column("ack_level", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Durable subscriptions and consumer groups.  ``checkpoint`` is the position of
# the last event acknowledged (every event at or below it is done).
# ``fetched_position``/``fetched_time`` remember the last batch handed out by a
# fetch-style protocol, so that a progress call can be matched to it.  Names
# are scoped by context (tenants may choose the same name and never meet).
subscriptions = Table(
    "subscriptions",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("context", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("selector", JSONB, nullable=False),
    Column("checkpoint", BigInteger, nullable=False),
    Column("fetched_position", BigInteger),
    Column("fetched_time", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # Persistent-subscription settings and fetch retries (revision 0006).
    Column("settings", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("fetch_attempts", Integer, nullable=False, server_default="0"),
    # Who created it (revision 0010): the per-principal quota's count; "" the
    # anonymous user, NULL the operator (or a row from before 0010).
    Column("created_by", Text),
    UniqueConstraint("context", "name", name="subscriptions_context_name_key"),
    Index("subscriptions_created_by_idx", "created_by",
          postgresql_where=text("created_by IS NOT NULL")),
)

# Events a persistent subscription gave up on (revision 0006; core.parking).
parked_events = Table(
    "parked_events",
    metadata,
    Column("subscription_id", BigInteger, ForeignKey("subscriptions.id", ondelete="CASCADE"),
           primary_key=True),
    Column("position", BigInteger, primary_key=True),
    Column("retries", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("parked_at", DateTime(timezone=True), nullable=False),
    Column("replay", Boolean, nullable=False, server_default=false()),
)

users = Table(
    "users",
    metadata,
    Column("name", Text, primary_key=True),
    Column("password_hash", Text, nullable=False),
    Column("default_context", Text, nullable=False, server_default=text("'default'")),
    # NULL = every context.
    Column("contexts", ARRAY(Text)),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# Res01 CURVE client public keys (Z85) and their users (revision 0005).
curve_keys = Table(
    "curve_keys",
    metadata,
    Column("public_key", Text, primary_key=True),
    Column("user_name", Text, ForeignKey("users.name", ondelete="CASCADE"), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("curve_keys_user", "user_name"),
)

binders = Table(
    "binders",
    metadata,
    Column("name", Text, primary_key=True),
    Column("context", Text, nullable=False),
    Column("stream_prefix", Text, nullable=False),
    Column("types", ARRAY(Text)),
    Column("fold", Text, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

binder_documents = Table(
    "binder_documents",
    metadata,
    Column("binder", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("document", JSONB, nullable=False),
    Column("position", BigInteger, nullable=False),
)

# Events a binder could not fold and skipped (revision 0004).
binder_errors = Table(
    "binder_errors",
    metadata,
    Column("binder", Text, primary_key=True),
    Column("position", BigInteger, primary_key=True),
    Column("error", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
)

# --- pipeline (revision 0002) ---------------------------------------------------

# Events and body bytes per context, stream category (stream name up to the
# first "-"), type and hour; filled by ``polyport pipeline stats``.
event_stats = Table(
    "event_stats",
    metadata,
    Column("context", Text, primary_key=True),
    Column("category", Text, primary_key=True),
    Column("type", Text, primary_key=True),
    Column("hour", DateTime(timezone=True), primary_key=True),
    Column("events", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),
)

# Incremental pipeline jobs: every event at or below ``position`` is done;
# ``pending_position`` marks an export that may have published past it.
pipeline_checkpoints = Table(
    "pipeline_checkpoints",
    metadata,
    Column("job", Text, primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("pending_position", BigInteger),
)

# Where Spark leaves its results before one transaction moves them into place.
pipeline_stats_staging = Table(
    "pipeline_stats_staging",
    metadata,
    Column("context", Text, nullable=False),
    Column("category", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("hour", DateTime(timezone=True), nullable=False),
    Column("events", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    prefixes=["UNLOGGED"],
)

pipeline_binder_staging = Table(
    "pipeline_binder_staging",
    metadata,
    Column("binder", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("document", Text, nullable=False),
    Column("position", BigInteger, nullable=False),
    prefixes=["UNLOGGED"],
)
