"""The commit chain's messages between a worker and the chain process
(core/chain.py): MessagePack arrays, what one side has for the other in one
event-loop turn travelling as one array of them::

    worker -> chain   [APPEND, uid, [append, ...], size, cost]
                                                        one unit (Append or AppendBatch),
                                                        checked by the worker (core/limits.py)
                      [FEED, wants_rows]                whether to send commits' rows
    chain -> worker   [RESULT, uid, [result, ...]]      the unit committed, one result
                                                        per append, in order
                      [FAILED, uid, code, message, n]   it failed (n: current version / reader)
                      [COMMIT, base, t0, count, rows, planned, refused]
                                                        a commit, rows or nil; then the
                                                        chain writer's commits at planned
                                                        positions and refusals so far

An append travels in two forms at once.  The fields of the
:class:`~core.commands.Append` itself, so that the chain can rebuild it
exactly when a batch needs the checked path (a failed check, a re-sent event
id, a lost connection).  And, per event, the part of its row in the fast
path's jsonb document (core/sql.py, ``_fast_append``) that does not depend
on where the event lands, already encoded by the worker: the chain, the one
core every commit goes through, only splices the stream version and the
offsets in (core/chain_writer.py) instead of building an ``Append``, its
events, the planner's rows and their JSON (measured in docs/performance.md,
session 19)::

    append  [context, stream, expected, origin, producer_id | nil, ack_level, tail,
             [event, ...]]
            expected: -1 any, 0 no stream, else the expected next version
            tail: the row document's ``,origin,context,stream,`` (JSON)
    event   [event_id (16 bytes), type, body, headers | nil, content_type,
             client_time (µs since the epoch) | nil, head]
            head: the row document's ``[event_id,type,headers,content_type,client_time``

A result is ``[first_version, last_version, first_position, last_position,
recorded_at (µs), idempotent, commit_id (16 bytes)]``; its context and stream
are the append's, which the worker holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import msgpack
import orjson

from polyport.core.builders import uuid_from_bytes
from polyport.core.commands import (
    ANY,
    NO_STREAM,
    Append,
    AppendResult,
    ExactVersion,
    Expected,
    NoStream,
    ProducerCheckpoint,
    build_append,
    build_append_result,
)
from polyport.core.errors import (
    ERROR_BY_CODE,
    Busy,
    PolyportError,
    Timeout,
    WrongExpectedVersion,
)
from polyport.core.events import build_event_data

# The messages' version, part of the name of the socket the chain listens
# on (gateway/process/workers.chain_socket_path): a worker restarted from
# newer code on disk while the gateway runs (an upgrade in place) finds no
# chain of its own version, and commits on its own (the head row orders
# both), instead of exchanging messages neither side can read.
WIRE_VERSION = 2

APPEND, FEED = 0, 1
RESULT, FAILED, COMMIT = 0, 1, 2

# A connection between processes of one gateway; large only because one
# unit may be a whole 32 MiB batch.
MAX_MESSAGE_BYTES = 64 << 20

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
_dumps = orjson.dumps


def us(t: datetime) -> int:
    """Microseconds since the epoch."""
    return (t - _EPOCH) // _ONE_US


def from_us(value: int) -> datetime:
    # timedelta's keyword arguments cost as much again as the rest: 0.5
    # against 1.1 us, once per result a worker decodes.
    return _EPOCH + timedelta(0, 0, value)


def unpacker() -> msgpack.Unpacker:
    return msgpack.Unpacker(raw=False, max_buffer_size=MAX_MESSAGE_BYTES,
                            strict_map_key=False)


def encode_append(a: Append) -> list[Any]:
    exp = a.expected
    expected = -1 if exp is ANY else 0 if isinstance(exp, NoStream) else exp.next_version  # type: ignore[union-attr]
    cp = a.producer_checkpoint
    events = []
    for e in a.events:
        headers = dict(e.headers) if e.headers else None
        # orjson writes the UUID and the zone-aware client time (RFC 3339)
        # in forms the fast statement's casts read.
        head = _dumps([e.event_id, e.type, headers or {}, e.content_type, e.client_time])
        events.append([e.event_id.bytes, e.type, e.body, headers, e.content_type,
                       None if e.client_time is None else us(e.client_time),
                       head[:-1].decode()])
    return [
        a.context, a.stream, expected, a.origin,
        None if cp is None else cp.producer_id.bytes, 0 if cp is None else cp.ack_level,
        "," + _dumps([a.origin, a.context, a.stream])[1:-1].decode() + ",",
        events,
    ]


def decode_append(x: Sequence[Any]) -> Append:
    context, stream, expected, origin, cp_id, cp_level, _tail, events = x
    exp: Expected = ANY if expected < 0 else NO_STREAM if expected == 0 else ExactVersion(expected)
    return build_append(
        context, stream,
        tuple([
            # EventData's __post_init__ is skipped: headers frozen here, the
            # body is bytes (MessagePack bin), a client time is UTC (from_us).
            build_event_data(type_, body, uuid_from_bytes(eid),
                             MappingProxyType(headers) if headers else _NO_HEADERS,
                             content_type, None if ct is None else from_us(ct))
            for eid, type_, body, headers, content_type, ct, _head in events
        ]),
        exp, origin,
        None if cp_id is None else ProducerCheckpoint(uuid_from_bytes(cp_id), cp_level),
    )


def encode_results(results: Sequence[AppendResult]) -> list[Any]:
    return [[r.first_version, r.last_version, r.first_position, r.last_position,
             us(r.recorded_at), r.idempotent, r.commit_id.bytes]
            for r in results]


def decode_results(appends: Sequence[Append], x: list[Any]) -> list[AppendResult]:
    """The results of ``appends``, the unit the worker sent."""
    return [build_append_result(a.context, a.stream, fv, lv, fp, lp, from_us(at),
                                uuid_from_bytes(cid), idem)
            for a, (fv, lv, fp, lp, at, idem, cid) in zip(appends, x, strict=True)]


def encode_failure(uid: int, err: PolyportError) -> list[Any]:
    extra = 0
    if isinstance(err, WrongExpectedVersion):
        extra = err.current_version
    elif isinstance(err, Busy | Timeout):
        extra = int(err.reader)
    return [FAILED, uid, err.code, err.message, extra]


def decode_failure(code: str, message: str, extra: int) -> PolyportError:
    if code == WrongExpectedVersion.code:
        return WrongExpectedVersion(message, current_version=extra)
    if code in (Busy.code, Timeout.code):
        return ERROR_BY_CODE[code](message, reader=bool(extra))  # type: ignore[call-arg]
    return ERROR_BY_CODE.get(code, PolyportError)(message)


def encode_rows(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The planner's row layout (see core/planner.py) for the wire."""
    return [[r[0].bytes, r[1], r[2], r[3], r[4], r[5] or None, r[6], r[7],
             None if r[8] is None else us(r[8]), r[9], r[10]] for r in rows]


def decode_rows(x: list[Any]) -> list[tuple[Any, ...]]:
    return [(uuid_from_bytes(eid), c, s, v, t, h or {}, body, ct,
             None if client is None else from_us(client), origin, offset)
            for eid, c, s, v, t, h, body, ct, client, origin, offset in x]
