"""Commits at planned positions: ``log_head.last_commit`` and
``polyport_append_at``.

Until now every fast commit moved the head row first and then inserted its
events, so the head row's lock was held through every insert and through
COMMIT's WAL flush: one backend inserted at a time, whatever the number of
connections.  On the 2-core machine that put PostgreSQL's own ceiling for
the fast statement near 45,000-56,000 events/s with its CPU at 1.1 cores
(docs/performance.md, session 21).

A writer that knows where the head stands (it made the last commit) plans
the next batch's positions and times itself and calls ``polyport_append_at``:

1. take the commit's ticket (a transaction-level advisory lock), which the
   next commit waits on;
2. insert the events, in parallel with the commit before, whose
   transaction may still be open;
3. wait until the commit before has ended (its ticket is free) and check
   that the head is exactly where it left it: its last position *and* its
   token (``last_commit``); anything else -- it failed, another process
   committed, it has not started -- raises ``serialization_failure`` and the
   whole transaction, events included, rolls back;
4. move the head and stamp this commit's token, then register new streams
   and move producer checkpoints (after the wait: the commit before may
   touch the same rows, and waiting for it while holding them could
   deadlock).

So positions stay gapless and in commit order for every reader, as before:
a commit becomes visible only after the one before it, and never without
it.  Only step 4 and the commit's WAL flush are serialised.

The token makes the check exact: a position alone could be reached again by
a different history (the commit before failed, and a commit of the same
size took its place), after which this batch's planned stream versions
would no longer follow.  Every fast commit writes a new token; commits that
do not (the checked path, gateways from before this revision) still move
the position, which the check sees.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# How long (1 ms steps) a commit waits for the one before it to start, when
# it finds the head short of its base and that commit's ticket free: the
# commit before was sent first, so it has started unless its backend has
# not been scheduled yet; if it failed, the wait ends the same way.
_FUNCTION = """
CREATE FUNCTION polyport_append_at(
    n int, doc jsonb, bodies bytea, base bigint, t0 timestamptz,
    after_commit uuid, this_commit uuid, ticket bigint, after_ticket bigint,
    new_contexts text[], new_streams text[],
    cp_producers uuid[], cp_contexts text[], cp_streams text[], cp_levels bigint[]
) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    head_position bigint;
    head_commit uuid;
    tries int := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(ticket);
    INSERT INTO events (position, event_id, context, stream, version, type, headers, body,
                        content_type, client_time, recorded_at, origin, segment_offset)
    SELECT base + k.i, (k.r->>0)::uuid, k.r->>6, k.r->>7, (k.r->>8)::bigint, k.r->>1,
           k.r->2, substring(bodies FROM (k.r->>10)::int + 1 FOR (k.r->>11)::int),
           k.r->>3, (k.r->>4)::timestamptz,
           t0 + (k.i - 1) * interval '1 microsecond', k.r->>5, (k.r->>9)::bigint
    FROM jsonb_array_elements(doc) WITH ORDINALITY AS k(r, i);
    LOOP
        -- Taken and let go at once: only waits for the commit before to
        -- end, and leaves its ticket free for it if it has not started.
        PERFORM pg_advisory_lock_shared(after_ticket);
        PERFORM pg_advisory_unlock_shared(after_ticket);
        SELECT h.last_position, h.last_commit INTO head_position, head_commit
        FROM log_head h WHERE h.id = 1;
        EXIT WHEN head_position = base AND head_commit = after_commit;
        IF head_position >= base OR tries >= 50 THEN
            RAISE EXCEPTION 'polyport: the log head is at %, not where this commit planned '
                            'to follow it (%)', head_position, base
                USING ERRCODE = 'serialization_failure';
        END IF;
        tries := tries + 1;
        PERFORM pg_sleep(0.001);
    END LOOP;
    UPDATE log_head
    SET last_position = base + n,
        last_recorded_at = t0 + (n - 1) * interval '1 microsecond',
        last_commit = this_commit
    WHERE id = 1 AND last_position = base AND last_commit = after_commit;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'polyport: the log head moved while this commit waited for it'
            USING ERRCODE = 'serialization_failure';
    END IF;
    IF new_contexts IS NOT NULL THEN
        INSERT INTO streams (context, stream, created_at)
        SELECT s.context, s.stream, now()
        FROM unnest(new_contexts, new_streams) AS s(context, stream)
        ON CONFLICT (context, stream) DO NOTHING;
    END IF;
    IF cp_producers IS NOT NULL THEN
        INSERT INTO producer_checkpoints (producer_id, context, stream, ack_level, updated_at)
        SELECT c.producer_id, c.context, c.stream, c.ack_level, now()
        FROM unnest(cp_producers, cp_contexts, cp_streams, cp_levels)
             AS c(producer_id, context, stream, ack_level)
        ON CONFLICT (producer_id, context, stream) DO UPDATE
        SET ack_level = GREATEST(producer_checkpoints.ack_level, EXCLUDED.ack_level),
            updated_at = now();
    END IF;
END
$fn$
"""

_SIGNATURE = ("polyport_append_at(int, jsonb, bytea, bigint, timestamptz, uuid, uuid, bigint, "
              "bigint, text[], text[], uuid[], text[], text[], bigint[])")


def upgrade() -> None:
    op.add_column("log_head", sa.Column("last_commit", UUID(as_uuid=True), nullable=True))
    op.execute(_FUNCTION)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {_SIGNATURE}")
    op.drop_column("log_head", "last_commit")
