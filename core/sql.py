"""Every SQL statement the core runs, by name.

Statements are plain text for asyncpg: the hot paths (group commit, tailing,
catch-up reads) want its binary protocol and COPY without an ORM in between.
The tables are described in :mod:`core.schema` and created by ``migrations/``.
Gateway and protocol modules hold no SQL of their own (tests/test_layers.py):
what they report comes through :mod:`core.monitor`, and the embedded
cluster's bootstrap statements are at the end of this module.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from polyport.core.events import SEGMENT_EVENT_HEADER_SIZE

EVENT_COLUMNS = (
    "position",
    "event_id",
    "context",
    "stream",
    "version",
    "type",
    "headers",
    "body",
    "content_type",
    "client_time",
    "recorded_at",
    "origin",
    "segment_offset",
)
_COLS = ", ".join(EVENT_COLUMNS)

# --- group commit -------------------------------------------------------------

# Taken first by every append transaction, in every process: serialises
# committers so that positions are assigned in commit order without gaps.
LOCK_HEAD = """
SELECT last_position, last_recorded_at, clock_timestamp() AS now
FROM log_head WHERE id = 1 FOR UPDATE
"""

UPDATE_HEAD = "UPDATE log_head SET last_position = $1, last_recorded_at = $2 WHERE id = 1"

# A stream's state is its last event: the version, and where the segment view
# ends (that event's offset plus its framed size).  Derived from ``events``
# rather than kept in a row per stream, so appends write no stream rows.
_LAST_EVENT_STATE = f"""
    SELECT e.version AS last_version,
           e.segment_offset + {SEGMENT_EVENT_HEADER_SIZE} + octet_length(e.body) AS segment_length
    FROM events e
    WHERE e.context = k.context AND e.stream = k.stream
    ORDER BY e.version DESC LIMIT 1
"""

STREAM_STATES = f"""
SELECT k.context, k.stream, st.last_version, st.segment_length
FROM unnest($1::text[], $2::text[]) AS k(context, stream)
CROSS JOIN LATERAL ({_LAST_EVENT_STATE}) st
"""

# An event id is unique within its context: (context, event id) pairs, $1
# the contexts and $2 the ids, zipped.
EXISTING_EVENT_IDS = (
    f"SELECT {_COLS} FROM events "
    "WHERE (context, event_id) IN (SELECT * FROM unnest($1::text[], $2::uuid[]))"
)
# Did a commit whose outcome is unknown store anything? (Its batch commits whole.)
ANY_EVENT_ID_STORED = (
    "SELECT EXISTS (SELECT 1 FROM events "
    "WHERE (context, event_id) IN (SELECT * FROM unnest($1::text[], $2::uuid[])))"
)

# The stream registry: one row per stream, written by its first append.
INSERT_STREAMS = """
INSERT INTO streams (context, stream, created_at)
SELECT k.context, k.stream, $3
FROM unnest($1::text[], $2::text[]) AS k(context, stream)
ON CONFLICT (context, stream) DO NOTHING
"""

UPSERT_PRODUCER_CHECKPOINT = """
INSERT INTO producer_checkpoints (producer_id, context, stream, ack_level, updated_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (producer_id, context, stream) DO UPDATE
SET ack_level = GREATEST(producer_checkpoints.ack_level, EXCLUDED.ack_level),
    updated_at = now()
"""

GET_PRODUCER_CHECKPOINT = """
SELECT ack_level FROM producer_checkpoints
WHERE producer_id = $1 AND context = $2 AND stream = $3
"""

NOTIFY_CHANNEL = "polyport_events"
NOTIFY = "SELECT pg_notify('polyport_events', $1)"

# Who hears NOTIFY_CHANNEL (core/notify.py).  Every tailer's LISTEN
# connection also holds a shared advisory lock (LISTENER_LOCK_KEY, its
# notify group): it lives exactly as long as the LISTEN, and pg_locks,
# unlike the listen registry, is readable by any role.  A notifier sends
# only while some other group's listener holds one; processes of its own
# group hear of its commits without a NOTIFY.
LISTENER_LOCK_KEY = 0x706F6C79  # "poly"
# The try form never waits: an exclusive lock on the same two keys (a
# consumer group whose names hash to them, GroupLocks) must not hang the
# LISTEN; without the lock this process is only heard from by polling.
HOLD_LISTENER_LOCK = "SELECT pg_try_advisory_lock_shared($1::int4, $2::int4)"
# Said by a listener once it holds the lock (payload: its group), so that
# notifiers look again at once rather than at their next PRESENCE_INTERVAL.
LISTENER_HELLO_CHANNEL = "polyport_listeners"
LISTENER_HELLO = "SELECT pg_notify('polyport_listeners', $1)"
OTHER_LISTENERS = """
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND classid = $1::int4::oid AND objid <> $2::int4::oid
)
"""

# Sent by every migration run, in its transaction (so at its commit): a
# gateway hearing it checks its schema at once instead of at its next timer.
SCHEMA_CHANNEL = "polyport_schema"
SCHEMA_CHANGED = "SELECT pg_notify('polyport_schema', '')"

# --- reads --------------------------------------------------------------------

HEAD_POSITION = "SELECT last_position FROM log_head WHERE id = 1"

RECORDED_AT = "SELECT recorded_at FROM events WHERE position = $1"
RECORDED_AT_MANY = "SELECT position, recorded_at FROM events WHERE position = ANY($1::bigint[])"

# Positions and, within a stream, versions have no gaps (and what is visible
# of them is a prefix: commits take the head row's lock in position order).
# So a read of n rows names its n keys as a closed range, and whatever plan
# PostgreSQL picks, statistics or none, it reads those rows and no others.
# (A client's version may be near the top of bigint: READ_STREAM's end is
# cut so that it never overflows; $3 >= 1.)
READ_ALL_AFTER = f"""
SELECT {_COLS} FROM events WHERE position > $1 AND position <= $1 + $2
ORDER BY position LIMIT $2
"""

READ_STREAM = f"""
SELECT {_COLS} FROM events
WHERE context = $1 AND stream = $2 AND version >= $3
  AND version < $3 + least($4, 9223372036854775807 - $3)
ORDER BY version LIMIT $4
"""

# A stream's state (NULLs when it has no events) and the log's head in one
# snapshot: every event of the stream beyond segment_length has a position
# above head (visible positions are a prefix), so a reader at the tail can
# wait for positions after head.
STREAM_STATE = f"""
SELECT h.last_position AS head, st.last_version, st.segment_length
FROM log_head h
CROSS JOIN (SELECT $1::text AS context, $2::text AS stream) k
LEFT JOIN LATERAL ({_LAST_EVENT_STATE}) st ON true
WHERE h.id = 1
"""


def _bisect(upper: str, hit: str) -> str:
    """The least key in [1, ``upper``] for which ``hit`` (a scalar subquery
    on the row of the key ``b.m``) says true, or ``upper`` + 1: a binary
    search over a gapless key whose predicate is false, then true.  About 20
    probes at a million rows, each an equality lookup on a unique index (a
    correlated subquery, which the planner cannot turn into a join over all
    of a stream's rows; OFFSET 0 keeps it from being copied into both CASEs,
    which would probe twice): no plan, cached or not, reads more, where a range
    scan for the same answer reads every row before or after it."""
    return f"""(WITH RECURSIVE bisect(lo, hi) AS (
    SELECT 0::bigint, coalesce(({upper}), 0) + 1
  UNION ALL
    SELECT CASE WHEN b.hit THEN b.lo ELSE b.m END, CASE WHEN b.hit THEN b.m ELSE b.hi END
    FROM (SELECT lo, hi, m, ({hit}) AS hit
          FROM (SELECT lo, hi, (lo + hi) / 2 AS m FROM bisect WHERE hi - lo > 1) b
          OFFSET 0) b
)
SELECT min(hi) FROM bisect)"""


# Versions count 1, 2, ... without gaps and events are never deleted; along
# the versions positions and segment offsets rise.
_LAST_VERSION = (
    "SELECT version FROM events WHERE context = {c} AND stream = {s} "
    "ORDER BY version DESC LIMIT 1"
)


def _first_version_where(context: str, stream: str, hit: str) -> str:
    """The first version of a stream whose event meets ``hit``."""
    return _bisect(
        _LAST_VERSION.format(c=context, s=stream),
        f"SELECT {hit} FROM events e "
        f"WHERE e.context = {context} AND e.stream = {stream} AND e.version = b.m",
    )


# The event whose framed bytes contain ``offset``, and those after it
# (the last event when the offset is past the end).
READ_SEGMENT_FROM = f"""
WITH s AS MATERIALIZED (
    SELECT greatest({_first_version_where("$1", "$2", "e.segment_offset > $3")} - 1, 1) AS first
)
SELECT {_COLS} FROM events
WHERE context = $1 AND stream = $2
  AND version >= (SELECT first FROM s) AND version < (SELECT first FROM s) + $4
ORDER BY version LIMIT $4
"""

# The events in positions ($1, $2] that a selector's indexable parts pick,
# at most $7 of them; the matcher runs in Python.  $3..$6 (selected_params)
# are NULL when the selector does not constrain them.  The range is read
# through the primary key and the filters apply to what it yields: OFFSET 0
# keeps them out of the scan, so that no plan (a generic one included, which
# cannot tell a rare context from the whole log) trades the key for an index
# on context that leads to a sort of every row of that context.  Callers cut
# the range to the batch's size (at least SCAN_WINDOW positions): each
# statement reads that many rows whatever plan reads them, and a filter that
# picks few rows costs one window per statement, not a scan to the head.
_SELECTED = """
FROM (SELECT * FROM events WHERE position > $1 AND position <= $2
      ORDER BY position OFFSET 0) e
WHERE ($3::text IS NULL OR context = $3)
  AND ($4::text IS NULL OR stream = $4)
  AND ($5::text IS NULL OR starts_with(stream, $5))
  AND ($6::text[] IS NULL OR type = ANY($6))
ORDER BY position LIMIT $7
"""

SCAN_WINDOW = 100

# Catch-up reads for subscriptions and binders: the log, a context, a prefix.
READ_SELECTED = f"SELECT {_COLS} {_SELECTED}"

# One stream's events in positions ($1, $2], at most $5: through the stream's
# (context, stream, version) key from the first version past $1 (found by
# bisection), whatever else the log holds.  Types and matchers apply in Python.
READ_STREAM_SELECTED = f"""
WITH s AS MATERIALIZED (
    SELECT {_first_version_where("$3", "$4", "e.position > $1")} AS first
)
SELECT {_COLS} FROM events
WHERE context = $3 AND stream = $4
  AND version >= (SELECT first FROM s) AND version < (SELECT first FROM s) + $5
  AND position <= $2
ORDER BY version LIMIT $5
"""

# Subscription lag: how many of those events there are, and the oldest one's time.
COUNT_SELECTED = f"""
SELECT count(*) AS n, min(recorded_at) AS oldest FROM (SELECT recorded_at {_SELECTED}) t
"""


def selected_params(
    context: str | None, stream: str | None, prefix: str | None, types: Collection[str]
) -> tuple[str | None, str | None, str | None, list[str] | None]:
    """$3..$6 of READ_SELECTED and COUNT_SELECTED."""
    return context, stream, prefix, sorted(types) if types else None


@dataclass(frozen=True, slots=True)
class SelectedRead:
    """A catch-up read: the statement, its arguments, and the end of the
    range it covers (``upper``, or less where the log is scanned)."""

    statement: str
    args: tuple[object, ...]
    upper: int


def selected_read(
    after: int,
    upper: int,
    limit: int,
    context: str | None,
    stream: str | None,
    prefix: str | None,
    types: Collection[str],
) -> SelectedRead:
    """The statement shape for a selector: one stream through its key,
    anything else through the log's (see _SELECTED)."""
    if context is not None and stream is not None:
        return SelectedRead(READ_STREAM_SELECTED, (after, upper, context, stream, limit), upper)
    cut = min(upper, after + max(limit, SCAN_WINDOW))
    return SelectedRead(
        READ_SELECTED,
        (after, cut, *selected_params(context, stream, prefix, types), limit),
        cut,
    )


# The last position recorded before $1 (recorded_at rises with the position).
POSITION_BEFORE_TIME = "SELECT " + _bisect(
    "SELECT last_position FROM log_head WHERE id = 1",
    "SELECT e.recorded_at >= $1 FROM events e WHERE e.position = b.m",
) + " - 1"

POSITION_BEFORE_VERSION = """
SELECT position - 1 FROM events
WHERE context = $1 AND stream = $2 AND version >= $3
ORDER BY version LIMIT 1
"""

# --- durable subscriptions ----------------------------------------------------

# Durable names are scoped by context: every lookup by name takes (context, name).
GET_SUBSCRIPTION = """
SELECT id, context, name, selector, checkpoint, fetched_position, fetched_time
FROM subscriptions WHERE context = $1 AND name = $2
"""

# What one Res01 FE needs before it reads, in one round trip: the
# subscription, its settings (max_retries), the head to read up to, and
# whether parked events wait for replay (rarely: then FETCH_REPLAY_DUE).
FETCH_STATE = """
SELECT s.id, s.context, s.name, s.selector, s.checkpoint, s.settings,
       (SELECT last_position FROM log_head WHERE id = 1) AS head,
       EXISTS (SELECT 1 FROM parked_events p
               WHERE p.subscription_id = s.id AND p.replay AND p.position <= s.checkpoint)
           AS replay_due
FROM subscriptions s WHERE s.id = $1
"""

# An FE whose batch the store took from memory on what it last knew of the
# subscription: FETCH_STATE's row, and RECORD_FETCH done in the same round
# trip only if that knowledge still holds -- the checkpoint it read from
# ($2) and the selector it filtered with ($3) unchanged, no replay due and
# no max_retries (whose fetch counting takes the full path).  ``recorded``
# says which; when false nothing was written and the row is the state to
# fetch from, as FETCH_STATE's.  ``u.checkpoint = $2`` is checked again on
# the row being updated, so a PS committed meanwhile is not overwritten.
#   $4, $5: the batch's last position and recorded_at (as RECORD_FETCH)
FETCH_STATE_RECORDING = f"""
WITH s AS ({FETCH_STATE}), recorded AS (
    UPDATE subscriptions u SET fetched_position = $4, fetched_time = $5, updated_at = now()
    FROM s, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush
    WHERE u.id = s.id AND s.checkpoint = $2 AND u.checkpoint = $2
      AND s.selector = $3::jsonb AND u.selector = $3::jsonb
      AND NOT s.replay_due AND s.settings->>'max_retries' IS NULL
    RETURNING u.id
)
SELECT s.*, EXISTS (SELECT 1 FROM recorded) AS recorded FROM s
"""

GET_SUBSCRIPTION_BY_ID = """
SELECT id, context, name, selector, checkpoint, fetched_position, fetched_time
FROM subscriptions WHERE id = $1
"""

CREATE_SUBSCRIPTION = """
INSERT INTO subscriptions (context, name, selector, checkpoint, created_by, created_at,
                           updated_at)
VALUES ($1, $2, $3::jsonb, $4, $5, now(), now())
ON CONFLICT (context, name) DO NOTHING
RETURNING id, context, name, selector, checkpoint, fetched_position, fetched_time
"""

# The durable quota (core.limits.DurableLimits.max_per_context): creations in
# one context take turns on this transaction-scoped lock, so the count and the
# insert after it cannot be raced past the quota by another process.  The
# one-key form never meets the group locks' two-key (context, name) locks.
DURABLE_QUOTA_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('polyport.durable-quota/' || $1, 0))"
)
COUNT_CONTEXT_SUBSCRIPTIONS = "SELECT count(*) FROM subscriptions WHERE context = $1"

# The per-principal quota (DurableLimits.max_per_principal): the rows a
# principal created, counted under its own lock (taken after the context's,
# always in that order, so two creations never wait on each other in a cycle).
DURABLE_PRINCIPAL_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('polyport.durable-owner/' || $1, 0))"
)
COUNT_PRINCIPAL_SUBSCRIPTIONS = "SELECT count(*) FROM subscriptions WHERE created_by = $1"

UPDATE_SUBSCRIPTION_SELECTOR = """
UPDATE subscriptions SET selector = $2::jsonb, updated_at = now() WHERE id = $1
"""

# Checkpoints only move forward through acks; seeks use SET_CHECKPOINT.
ADVANCE_CHECKPOINT = """
UPDATE subscriptions SET checkpoint = GREATEST(checkpoint, $3), updated_at = now()
WHERE context = $1 AND name = $2
"""

SET_CHECKPOINT = """
UPDATE subscriptions
SET checkpoint = $2, fetched_position = NULL, fetched_time = NULL, updated_at = now()
WHERE id = $1
"""

# Which batch an FE handed out, so that its PS can be matched; on the path of
# every fetch reply, so it commits without waiting for its WAL flush
# (set_config(..., true) lasts only for this statement's transaction).  A
# record lost in a crash only makes the PS that names it a no-op: the client
# fetches the same batch again (at least once), never skips one.
RECORD_FETCH = """
UPDATE subscriptions SET fetched_position = $2, fetched_time = $3, updated_at = now()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush
WHERE id = $1
"""

# Progress only if the caller names the batch it was handed (idempotent).
# A batch of replayed parked events ends at or before the checkpoint: its
# progress unparks those rows and leaves the checkpoint where it is.  A normal
# batch unparks only replay-marked rows inside it (after a seek backwards), so
# a replay requested while it was out is not lost.
# It commits without waiting for its WAL flush, as RECORD_FETCH does and as a
# consumer group's checkpoint is saved after its acks: a progress lost in a
# crash hands the batch out again (at least once), never skips one, and a
# flush per PS would queue in the FE/PS loop behind the appends' own flushes.
PROGRESS_FETCHED = """
WITH batch AS (
    SELECT id, checkpoint, fetched_position FROM subscriptions
    WHERE id = $1 AND fetched_time = $2 AND fetched_position IS NOT NULL
      -- $3: the contexts the caller may use (NULL: every one).  The row and
      -- its selector must both be among them (access.Tenant's ownership
      -- rule), so a PS needs no read of the row before it.
      AND ($3::text[] IS NULL
           OR (context = ANY($3::text[]) AND selector->>'context' = ANY($3::text[])))
    FOR UPDATE
), moved AS (
    UPDATE subscriptions s
    SET checkpoint = GREATEST(b.checkpoint, b.fetched_position), fetched_position = NULL,
        fetched_time = NULL, updated_at = now()
    FROM batch b, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush
    WHERE s.id = b.id
    RETURNING s.checkpoint
), unparked AS (
    DELETE FROM parked_events p USING batch b
    WHERE p.subscription_id = b.id AND p.replay AND p.position <= b.fetched_position
      AND (b.fetched_position <= b.checkpoint OR p.position > b.checkpoint)
)
SELECT checkpoint FROM moved
"""

# A replayed batch parked again: forget it was fetched, keep the checkpoint.
CLEAR_FETCH = """
UPDATE subscriptions SET fetched_position = NULL, fetched_time = NULL, updated_at = now()
WHERE id = $1
"""

LIST_SUBSCRIPTIONS = """
SELECT s.id, s.context, s.name, s.selector, s.checkpoint, s.updated_at, h.last_position
FROM subscriptions s CROSS JOIN log_head h ORDER BY s.id
"""

DELETE_SUBSCRIPTION = "DELETE FROM subscriptions WHERE context = $1 AND name = $2 RETURNING id"

# --- persistent subscriptions (core.parking) ----------------------------------

SUBSCRIPTION_SETTINGS = "SELECT id, settings FROM subscriptions WHERE context = $1 AND name = $2"

SET_SUBSCRIPTION_SETTINGS = """
UPDATE subscriptions SET settings = $2::jsonb, updated_at = now() WHERE id = $1
"""

# Settings and parked counts of every subscription, for listings.
PERSISTENT_STATE = """
SELECT s.id, s.settings,
       (SELECT count(*) FROM parked_events p WHERE p.subscription_id = s.id) AS parked
FROM subscriptions s
"""

# Parking again (a replayed event failed once more) refreshes the row.
PARK_EVENT = """
INSERT INTO parked_events (subscription_id, position, retries, reason, parked_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (subscription_id, position)
DO UPDATE SET retries = EXCLUDED.retries, reason = EXCLUDED.reason,
              parked_at = EXCLUDED.parked_at, replay = false
"""

# Parked counts by subscription (context, name), for /status.
PARKED_BY_NAME = """
SELECT s.context, s.name, count(*) AS parked
FROM parked_events p JOIN subscriptions s ON s.id = p.subscription_id
GROUP BY s.context, s.name
"""

UNPARK_EVENT = "DELETE FROM parked_events WHERE subscription_id = $1 AND position = $2"

LIST_PARKED = """
SELECT p.position, p.retries, p.reason, p.parked_at, p.replay, e.context, e.stream,
       e.version, e.type
FROM parked_events p JOIN events e ON e.position = p.position
WHERE p.subscription_id = $1 ORDER BY p.position LIMIT $2
"""

REQUEST_REPLAY = """
UPDATE parked_events SET replay = true WHERE subscription_id = $1 AND NOT replay
"""

# The parked events to hand out again, as events.
REPLAY_DUE = f"""
SELECT {', '.join('e.' + c for c in EVENT_COLUMNS)}
FROM parked_events p JOIN events e ON e.position = p.position
WHERE p.subscription_id = $1 AND p.replay ORDER BY p.position LIMIT $2
"""

# A fetch-style subscription's replayed parked events: only those the
# checkpoint has passed (after a seek backwards the rest come in order anyway).
FETCH_REPLAY_DUE = f"""
SELECT {', '.join('e.' + c for c in EVENT_COLUMNS)}
FROM parked_events p JOIN events e ON e.position = p.position
WHERE p.subscription_id = $1 AND p.replay AND p.position <= $2
ORDER BY p.position LIMIT $3
"""

# A fetch-style subscription's batch fetched again without progress.
COUNT_FETCH_ATTEMPT = """
UPDATE subscriptions
SET fetch_attempts = CASE WHEN fetched_position = $2 THEN fetch_attempts + 1 ELSE 1 END
WHERE id = $1 RETURNING fetch_attempts
"""

RESET_FETCH_ATTEMPTS = "UPDATE subscriptions SET fetch_attempts = 0 WHERE id = $1"

# Two int4 keys, (context, name): the same group name in two contexts is two
# locks.  (Two-key locks never meet the one-bigint-key locks the pipeline takes.)
TRY_GROUP_LOCK = "SELECT pg_try_advisory_lock(hashtext($1), hashtext($2))"
RELEASE_GROUP_LOCK = "SELECT pg_advisory_unlock(hashtext($1), hashtext($2))"

# --- monitoring (core.monitor: /status, /metrics, ``polyport status``) ----------

PING = "SELECT 1"

LOG_HEAD = "SELECT last_position, last_recorded_at FROM log_head WHERE id = 1"

# The planner's row estimate: counting a large table would scan it.
STREAMS_ESTIMATE = """
SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'streams'::regclass
"""

# Exact up to $1 rows (a bounded scan); past that the caller uses the estimate,
# which is 0 until the table was first analyzed.
STREAMS_COUNT_UP_TO = "SELECT count(*) FROM (SELECT 1 FROM streams LIMIT $1) AS s"

# Durable subscriptions with the head position, for lag; by name, the order
# /status and /metrics list them in.
DURABLE_CHECKPOINTS = """
SELECT s.name, s.selector, s.checkpoint, h.last_position
FROM subscriptions s CROSS JOIN log_head h ORDER BY s.name, s.context
"""

# The pipeline's hourly statistics (table created by its own migration):
# callers check that the table exists before reading it.
EVENT_STATS_EXISTS = "SELECT to_regclass('event_stats') IS NOT NULL"

# The last 48 hours that have statistics, one row per hour.
EVENT_STATS_HOURLY = """
WITH last AS (SELECT max(hour) AS h FROM event_stats)
SELECT s.hour, sum(s.events)::bigint AS events, sum(s.bytes)::bigint AS bytes
FROM event_stats s, last
WHERE s.hour > last.h - interval '48 hours'
GROUP BY s.hour ORDER BY s.hour
"""

EVENT_STATS_24H = """
SELECT coalesce(sum(events), 0)::bigint AS events, coalesce(sum(bytes), 0)::bigint AS bytes,
       max(hour) AS last_hour
FROM event_stats WHERE hour > now() - interval '24 hours'
"""

# --- users --------------------------------------------------------------------

GET_USER = "SELECT name, password_hash, default_context, contexts FROM users WHERE name = $1"

UPSERT_USER = """
INSERT INTO users (name, password_hash, default_context, contexts, created_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (name) DO UPDATE
SET password_hash = EXCLUDED.password_hash, default_context = EXCLUDED.default_context,
    contexts = EXCLUDED.contexts
"""

SET_USER_PASSWORD = "UPDATE users SET password_hash = $2 WHERE name = $1 RETURNING name"

SET_USER_CONTEXTS = """
UPDATE users SET contexts = $2, default_context = coalesce($3, default_context)
WHERE name = $1 RETURNING name
"""

LIST_USERS = "SELECT name, default_context, contexts, created_at FROM users ORDER BY name"

DELETE_USER = "DELETE FROM users WHERE name = $1 RETURNING name"

# A user's rights changed (removed, contexts or password set): every gateway
# process re-checks that user's open connections (core.users.UserChanges).
# The payload is the user name; empty = every user.  Rare, so NOTIFY's
# commit-time lock costs nothing here (unlike on the append path).
USERS_CHANNEL = "polyport_users"
NOTIFY_USERS = "SELECT pg_notify('polyport_users', $1)"

# Res01 CURVE client keys (Z85 public keys) of users.
ADD_CURVE_KEY = """
INSERT INTO curve_keys (public_key, user_name, created_at)
SELECT $1, name, now() FROM users WHERE name = $2 RETURNING user_name
"""

CURVE_KEY_USER = "SELECT user_name FROM curve_keys WHERE public_key = $1"

LIST_CURVE_KEYS = "SELECT public_key, user_name, created_at FROM curve_keys ORDER BY user_name"

DELETE_CURVE_KEY = "DELETE FROM curve_keys WHERE public_key = $1 RETURNING public_key"

# --- binders ------------------------------------------------------------------

# The schema check behind readiness (core.health), on a slow timer.
SCHEMA_REVISION = "SELECT version_num FROM alembic_version"

# Sessions of serving gateways on this database (they connect with
# application_name = core.migrate.GATEWAY_APPLICATION_NAME): a downgrade
# refuses to run under them.
GATEWAY_SESSIONS = """
SELECT count(*) AS sessions, coalesce(string_agg(DISTINCT coalesce(host(client_addr),
       'local socket'), ', '), '') AS clients
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid()
"""

CREATE_BINDER = """
INSERT INTO binders (name, context, stream_prefix, types, fold, position, created_at)
VALUES ($1, $2, $3, $4, $5, 0, now())
ON CONFLICT (name) DO NOTHING RETURNING name
"""

# With the events each binder skipped: how many, and the latest few.
LIST_BINDERS = """
SELECT b.name, b.context, b.stream_prefix, b.types, b.fold, b.position,
       (SELECT count(*) FROM binder_documents d WHERE d.binder = b.name) AS documents,
       (SELECT count(*) FROM binder_errors x WHERE x.binder = b.name) AS failures,
       (SELECT coalesce(json_agg(r ORDER BY r.position DESC), '[]')::text
        FROM (SELECT x.position, x.error, x.recorded_at FROM binder_errors x
              WHERE x.binder = b.name ORDER BY x.position DESC LIMIT 5) r) AS recent_failures
FROM binders b ORDER BY b.name
"""

GET_BINDER = """
SELECT name, context, stream_prefix, types, fold, position FROM binders WHERE name = $1
"""

LOCK_BINDER = """
SELECT name, context, stream_prefix, types, fold, position FROM binders
WHERE name = $1 FOR UPDATE SKIP LOCKED
"""

SET_BINDER_POSITION = "UPDATE binders SET position = $2 WHERE name = $1"

GET_BINDER_DOCUMENTS = """
SELECT key, document FROM binder_documents WHERE binder = $1 AND key = ANY($2::text[])
"""

UPSERT_BINDER_DOCUMENTS = """
INSERT INTO binder_documents (binder, key, document, position)
SELECT $1, k.key, k.document::jsonb, k.position
FROM unnest($2::text[], $3::text[], $4::bigint[]) AS k(key, document, position)
ON CONFLICT (binder, key) DO UPDATE
SET document = EXCLUDED.document, position = EXCLUDED.position
"""

SCAN_BINDER_DOCUMENTS = """
SELECT key, document FROM binder_documents
WHERE binder = $1 AND key > $2 ORDER BY key LIMIT $3
"""

CLEAR_BINDER_DOCUMENTS = "DELETE FROM binder_documents WHERE binder = $1"

CLEAR_BINDER_ERRORS = "DELETE FROM binder_errors WHERE binder = $1"

RECORD_BINDER_ERROR = """
INSERT INTO binder_errors (binder, position, error, recorded_at) VALUES ($1, $2, $3, now())
ON CONFLICT (binder, position) DO UPDATE
SET error = EXCLUDED.error, recorded_at = EXCLUDED.recorded_at
"""

DROP_BINDER = "DELETE FROM binders WHERE name = $1 RETURNING name"

# The group commit's fast path: one statement, one round trip, its own
# transaction.  The head row is updated first (every other CTE reads ``h``, so
# it runs first and its row lock serialises committers).  The writer planned
# against cached stream versions and writes no stream row: a stream that
# moved past the cached version already holds the first new version, which
# the unique index on (context, stream, version) refuses; the writer then
# takes the checked path.  (The cache is never ahead of the database: see
# Writer._cache_epoch.)  The rows travel as one jsonb document and the bodies
# as one bytea, each row naming its body's offset and length in it: one
# C-speed json.dumps instead of a typed array per column, whose elements
# asyncpg encodes one by one (measured in the running system: faster overall,
# the server's jsonb parse included), and one bytes.join instead of a bytea
# array, which asyncpg also walks element by element (with two isinstance
# checks against abstract classes each: 0.9 us of the writer's CPU per event,
# measured on the 2-core machine, docs/performance.md, session 15).
#   $1 number of events
#   $2 [[event_id (UUID text), type, headers{}, content_type,
#        client_time (ISO 8601) | null, origin, context, stream, version,
#        segment_offset, body offset in $3, body length], ...]
#      (the fields that do not depend on where an event lands come first: a
#      worker encodes them, the commit chain appends the rest, see
#      core/chain_wire.py)
#   $3 the bodies, one after another in the rows' order
# and, in the variants that need them (a CTE costs its executor set-up even
# when it has no rows, so the common case leaves them out):
#   new streams to register: context[], stream[]
#   producer checkpoints: producer_id[], context[], stream[], ack_level[]
#   last: this commit's token for log_head.last_commit (see APPEND_AT)
def _fast_append(new_streams: bool, checkpoints: bool) -> str:
    n = 3
    token = 4 + 2 * new_streams + 4 * checkpoints
    parts = [f"""
WITH h AS (
    UPDATE log_head
    SET last_position = last_position + $1,
        last_recorded_at = greatest(last_recorded_at + interval '1 microsecond',
                                    clock_timestamp())
                           + ($1 - 1) * interval '1 microsecond',
        last_commit = ${token}::uuid
    WHERE id = 1
    RETURNING last_position - $1 AS base,
              last_recorded_at - ($1 - 1) * interval '1 microsecond' AS t0
),
ins AS (
    INSERT INTO events (position, event_id, context, stream, version, type, headers, body,
                        content_type, client_time, recorded_at, origin, segment_offset)
    SELECT h.base + k.i, (k.r->>0)::uuid, k.r->>6, k.r->>7, (k.r->>8)::bigint, k.r->>1,
           k.r->2, substring($3::bytea FROM (k.r->>10)::int + 1 FOR (k.r->>11)::int),
           k.r->>3, (k.r->>4)::timestamptz,
           h.t0 + (k.i - 1) * interval '1 microsecond', k.r->>5, (k.r->>9)::bigint
    FROM h, jsonb_array_elements($2::jsonb) WITH ORDINALITY AS k(r, i)
)"""]
    if new_streams:
        parts.append(f"""
fresh AS (
    INSERT INTO streams (context, stream, created_at)
    SELECT s.context, s.stream, now()
    FROM h, unnest(${n + 1}::text[], ${n + 2}::text[]) AS s(context, stream)
    ON CONFLICT (context, stream) DO NOTHING
)""")
        n += 2
    if checkpoints:
        parts.append(f"""
pc AS (
    INSERT INTO producer_checkpoints (producer_id, context, stream, ack_level, updated_at)
    SELECT c.producer_id, c.context, c.stream, c.ack_level, now()
    FROM h, unnest(${n + 1}::uuid[], ${n + 2}::text[], ${n + 3}::text[], ${n + 4}::bigint[])
            AS c(producer_id, context, stream, ack_level)
    ON CONFLICT (producer_id, context, stream) DO UPDATE
    SET ack_level = GREATEST(producer_checkpoints.ack_level, EXCLUDED.ack_level),
        updated_at = now()
)""")
    # Data-modifying CTEs always run to completion, read or not (and an
    # INSERT … SELECT writes every row or fails): only ``h`` is returned.
    return ",".join(parts) + """
SELECT h.base, h.t0 FROM h
"""


FAST_APPEND = _fast_append(new_streams=False, checkpoints=False)
FAST_APPEND_NEW_STREAMS = _fast_append(new_streams=True, checkpoints=False)
FAST_APPEND_CHECKPOINTS = _fast_append(new_streams=False, checkpoints=True)
FAST_APPEND_NEW_STREAMS_CHECKPOINTS = _fast_append(new_streams=True, checkpoints=True)

# The fast path when the writer knows where the head stands (it made the
# commit before, which may still be in flight): the positions and times are
# planned, the events are inserted before the head is touched, and only then
# does the commit wait for the one before it and check the head is where that
# one left it (position and token), so that inserts of consecutive commits
# run in parallel and only the head's move and the WAL flush are serialised.
# The function is migration 0011's, which says why each step is where it is.
#   $1-$3 as FAST_APPEND; $4 base position; $5 first recorded_at;
#   $6 the token of the commit before; $7 this commit's token;
#   $8 this commit's ticket, $9 the commit before's (advisory lock keys);
#   $10, $11 new streams (context[], stream[]) or NULL;
#   $12-$15 producer checkpoints (producer_id[], context[], stream[],
#   ack_level[]) or NULL
APPEND_AT = """
SELECT polyport_append_at($1::int, $2::jsonb, $3::bytea, $4::bigint, $5::timestamptz,
                          $6::uuid, $7::uuid, $8::bigint, $9::bigint,
                          $10::text[], $11::text[],
                          $12::uuid[], $13::text[], $14::text[], $15::bigint[])
"""


# --- cluster bootstrap ----------------------------------------------------------
# Run through ``psql -c`` against the maintenance database of a cluster the
# gateway started itself (gateway.process.embedded_pg): psql takes no bind parameters,
# so the name is quoted here.


def database_exists(name: str) -> str:
    """Prints ``1`` when the database exists, nothing otherwise."""
    return f"SELECT 1 FROM pg_database WHERE datname={_literal(name)}"


def create_database(name: str) -> str:
    return f"CREATE DATABASE {_identifier(name)}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
