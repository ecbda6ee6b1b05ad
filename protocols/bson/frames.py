"""Frames of the BSON frames protocol: one frozen dataclass per frame type.

On the wire every frame is one BSON document ``{type: <TYPE>, frame: <body>}``.
Each class lists its body fields in ``FIELDS`` (wire name, attribute, BSON kind,
mandatory or not); ``wire.py`` validates and encodes from that table, so the
classes themselves stay plain values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from polyport.protocols.enums import IdentityEnum

DEFAULT_PORT = 7451
PROTOCOL = "bson"

MIB = 1024 * 1024
# A frame is refused as soon as its length prefix says it is larger than this.
DEFAULT_MAX_FRAME_SIZE = 16 * MIB
# Enforced by the adapter on EMIT (see wire.event_size), not by the framing.
DEFAULT_MAX_EVENT_SIZE = 1 * MIB
# ACKEV flow control (design brief): delivery pauses above, resumes below.
DEFAULT_FLOW_PAUSE_BYTES = 4 * MIB
DEFAULT_FLOW_RESUME_BYTES = 2 * MIB
# The spec's "maximum of X unacknowledged QUERYRESULT frames"; X is ours to pick.
DEFAULT_MAX_UNACKED_QUERY_RESULTS = 100

# Smallest possible BSON document: int32 length + the terminating NUL.
MIN_DOCUMENT_SIZE = 5
LENGTH_PREFIX_SIZE = 4

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Envelope keys.
KEY_TYPE = "type"
KEY_FRAME = "frame"

# Frame type names, as they appear in the envelope's ``type``.
CONNECT = "CONNECT"
RESPONSE = "RESPONSE"
EMIT = "EMIT"
STARTTX = "STARTTX"
COMMITTX = "COMMITTX"
ABORTTX = "ABORTTX"
SUBSCRIBE = "SUBSCRIBE"
SUBRESPONSE = "SUBRESPONSE"
UNSUBSCRIBE = "UNSUBSCRIBE"
RECEV = "RECEV"
ACKEV = "ACKEV"
QUERY = "QUERY"
QUERYRESPONSE = "QUERYRESPONSE"
QUERYRESULT = "QUERYRESULT"
QUERYACK = "QUERYACK"
PING = "PING"


class Kind(IdentityEnum):
    """BSON element types a body field may hold."""

    STRING = "string"
    BOOL = "boolean"
    INT32 = "int32"
    # int32 is accepted on input too: drivers encode small integers as int32.
    INT64 = "int64"
    DOCUMENT = "document"


@dataclass(frozen=True, slots=True)
class Field:
    wire: str
    attr: str
    kind: Kind
    required: bool = True
    min_value: int | None = None


Document = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Connect:
    version: str
    username: str | None = None
    password: str | None = None

    TYPE: ClassVar[str] = CONNECT
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("version", "version", Kind.STRING),
        Field("username", "username", Kind.STRING, required=False),
        Field("password", "password", Kind.STRING, required=False),
    )


@dataclass(frozen=True, slots=True)
class Response:
    ok: bool
    err_code: str | None = None
    err_msg: str | None = None

    TYPE: ClassVar[str] = RESPONSE
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("ok", "ok", Kind.BOOL),
        Field("errCode", "err_code", Kind.STRING, required=False),
        Field("errMsg", "err_msg", Kind.STRING, required=False),
    )


@dataclass(frozen=True, slots=True)
class Emit:
    stream_name: str
    event_type: str
    event: Document
    sess_id: int | None = None

    TYPE: ClassVar[str] = EMIT
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("streamName", "stream_name", Kind.STRING),
        Field("eventType", "event_type", Kind.STRING),
        Field("event", "event", Kind.DOCUMENT),
        Field("sessID", "sess_id", Kind.INT32, required=False),
    )


@dataclass(frozen=True, slots=True)
class StartTx:
    sess_id: int

    TYPE: ClassVar[str] = STARTTX
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("sessID", "sess_id", Kind.INT32),)


@dataclass(frozen=True, slots=True)
class CommitTx:
    sess_id: int

    TYPE: ClassVar[str] = COMMITTX
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("sessID", "sess_id", Kind.INT32),)


@dataclass(frozen=True, slots=True)
class AbortTx:
    sess_id: int

    TYPE: ClassVar[str] = ABORTTX
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("sessID", "sess_id", Kind.INT32),)


@dataclass(frozen=True, slots=True)
class Subscribe:
    stream_name: str
    event_type: str | None = None
    start_seq: int | None = None
    start_timestamp: int | None = None
    durable_id: str | None = None
    matcher: Document | None = None

    TYPE: ClassVar[str] = SUBSCRIBE
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("streamName", "stream_name", Kind.STRING),
        Field("eventType", "event_type", Kind.STRING, required=False),
        Field("startSeq", "start_seq", Kind.INT64, required=False),
        Field("startTimestamp", "start_timestamp", Kind.INT64, required=False),
        Field("durableID", "durable_id", Kind.STRING, required=False),
        Field("matcher", "matcher", Kind.DOCUMENT, required=False),
    )


@dataclass(frozen=True, slots=True)
class SubResponse:
    ok: bool
    err_code: str | None = None
    err_msg: str | None = None
    sub_id: int | None = None

    TYPE: ClassVar[str] = SUBRESPONSE
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("ok", "ok", Kind.BOOL),
        Field("errCode", "err_code", Kind.STRING, required=False),
        Field("errMsg", "err_msg", Kind.STRING, required=False),
        Field("subID", "sub_id", Kind.INT32, required=False),
    )


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    sub_id: int

    TYPE: ClassVar[str] = UNSUBSCRIBE
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("subID", "sub_id", Kind.INT32),)


@dataclass(frozen=True, slots=True)
class Recev:
    sub_id: int
    stream_name: str
    event_type: str
    timestamp: int
    seq_no: int
    event: Document

    TYPE: ClassVar[str] = RECEV
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("subID", "sub_id", Kind.INT32),
        Field("streamName", "stream_name", Kind.STRING),
        Field("eventType", "event_type", Kind.STRING),
        Field("timestamp", "timestamp", Kind.INT64),
        Field("seqNo", "seq_no", Kind.INT64),
        Field("event", "event", Kind.DOCUMENT),
    )


@dataclass(frozen=True, slots=True)
class AckEv:
    sub_id: int
    # Wire name ``bytes``: the encoded size of the RECEV frames acknowledged.
    num_bytes: int | None = None

    TYPE: ClassVar[str] = ACKEV
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("subID", "sub_id", Kind.INT32),
        Field("bytes", "num_bytes", Kind.INT32, required=False, min_value=0),
    )


@dataclass(frozen=True, slots=True)
class Query:
    query_id: int
    binder: str
    matcher: Document

    TYPE: ClassVar[str] = QUERY
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("queryID", "query_id", Kind.INT32),
        Field("binder", "binder", Kind.STRING),
        Field("matcher", "matcher", Kind.DOCUMENT),
    )


@dataclass(frozen=True, slots=True)
class QueryResponse:
    query_id: int
    num_results: int

    TYPE: ClassVar[str] = QUERYRESPONSE
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("queryID", "query_id", Kind.INT32),
        Field("numResults", "num_results", Kind.INT64, min_value=0),
    )


@dataclass(frozen=True, slots=True)
class QueryResult:
    query_id: int
    result: Document

    TYPE: ClassVar[str] = QUERYRESULT
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("queryID", "query_id", Kind.INT32),
        Field("result", "result", Kind.DOCUMENT),
    )


@dataclass(frozen=True, slots=True)
class QueryAck:
    query_id: int

    TYPE: ClassVar[str] = QUERYACK
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("queryID", "query_id", Kind.INT32),)


@dataclass(frozen=True, slots=True)
class Ping:
    TYPE: ClassVar[str] = PING
    FIELDS: ClassVar[tuple[Field, ...]] = ()


Frame = (
    Connect
    | Response
    | Emit
    | StartTx
    | CommitTx
    | AbortTx
    | Subscribe
    | SubResponse
    | Unsubscribe
    | Recev
    | AckEv
    | Query
    | QueryResponse
    | QueryResult
    | QueryAck
    | Ping
)

FRAME_CLASSES: dict[str, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Connect,
        Response,
        Emit,
        StartTx,
        CommitTx,
        AbortTx,
        Subscribe,
        SubResponse,
        Unsubscribe,
        Recev,
        AckEv,
        Query,
        QueryResponse,
        QueryResult,
        QueryAck,
        Ping,
    )
}

# Who may send what.
CLIENT_FRAME_TYPES = frozenset(
    {CONNECT, EMIT, STARTTX, COMMITTX, ABORTTX, SUBSCRIBE, UNSUBSCRIBE}
    | {ACKEV, QUERY, QUERYACK, PING}
)
SERVER_FRAME_TYPES = frozenset({RESPONSE, SUBRESPONSE, RECEV, QUERYRESPONSE, QUERYRESULT})
