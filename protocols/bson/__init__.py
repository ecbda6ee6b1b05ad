"""BSON frames protocol: sans-IO frames, wire format, state table and connections.

This package is ``protocols.bson``; pymongo's BSON library is the top-level
``bson``.  Every module here uses absolute imports, so ``import bson`` always
means pymongo's, as long as the ``protocols/`` directory itself is not put on
``sys.path`` (then this package would shadow pymongo's; the check below turns
that into a clear ImportError instead of a confusing circular import).
"""

from __future__ import annotations

if __name__ == "bson":  # pragma: no cover
    raise ImportError(
        "protocols/bson was imported as the top-level 'bson' module, shadowing pymongo's "
        "bson: remove the protocols/ directory from sys.path"
    )

from polyport.protocols.bson.connection import ClientConnection, ServerConnection
from polyport.protocols.bson.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestError,
)
from polyport.protocols.bson.frames import (
    DEFAULT_MAX_EVENT_SIZE,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_PORT,
    PROTOCOL,
    AbortTx,
    AckEv,
    CommitTx,
    Connect,
    Emit,
    Frame,
    Ping,
    Query,
    QueryAck,
    QueryResponse,
    QueryResult,
    Recev,
    Response,
    StartTx,
    SubResponse,
    Subscribe,
    Unsubscribe,
)
from polyport.protocols.bson.state import State, TransactionTable
from polyport.protocols.bson.wire import (
    DECODE_OPTIONS,
    ENCODE_OPTIONS,
    decode_frame,
    encode_frame,
    event_size,
    frame_from_document,
    frame_to_document,
    is_supported_version,
)

__all__ = [
    "DECODE_OPTIONS",
    "DEFAULT_MAX_EVENT_SIZE",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_PORT",
    "ENCODE_OPTIONS",
    "PROTOCOL",
    "AbortTx",
    "AckEv",
    "ClientConnection",
    "CommitTx",
    "Connect",
    "Emit",
    "Frame",
    "LocalProtocolError",
    "Ping",
    "ProtocolError",
    "Query",
    "QueryAck",
    "QueryResponse",
    "QueryResult",
    "Recev",
    "RemoteProtocolError",
    "RequestError",
    "Response",
    "ServerConnection",
    "StartTx",
    "State",
    "SubResponse",
    "Subscribe",
    "TransactionTable",
    "Unsubscribe",
    "decode_frame",
    "encode_frame",
    "event_size",
    "frame_from_document",
    "frame_to_document",
    "is_supported_version",
]
