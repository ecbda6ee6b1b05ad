"""RSocket 1.0: sans-IO codec and connection objects, and polyport's routes.

See docs/protocols/rsocket.md for routes, metadata, data, limits and how the
ReactiveSocket draft and RSocket 1.0 share the store.
"""

from polyport.protocols.reactive.connection import StreamError
from polyport.protocols.reactive.frames import Cancel, RequestN
from polyport.protocols.rsocket.connection import (
    ClientConnection,
    Event,
    ServerConnection,
)
from polyport.protocols.rsocket.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    error_frame,
)
from polyport.protocols.rsocket.frames import (
    DEFAULT_PORT,
    PROTOCOL,
    WEBSOCKET_PATH,
    ErrorFrame,
    Ext,
    Frame,
    Keepalive,
    Lease,
    MetadataPush,
    Payload,
    Request,
    RequestChannel,
    RequestFnf,
    RequestResponse,
    RequestStream,
    Resume,
    ResumeOk,
    Setup,
    UnknownFrame,
)
from polyport.protocols.rsocket.state import ConnectionState, Kind, Phase, StreamInfo
from polyport.protocols.rsocket.wire import (
    add_tcp_length,
    decode_frame,
    encode_for,
    encode_frame,
    encode_tcp_frame,
    fragment,
)

__all__ = [
    "DEFAULT_PORT", "PROTOCOL", "WEBSOCKET_PATH", "Cancel", "ClientConnection",
    "ConnectionState", "ErrorFrame", "Event", "Ext", "Frame", "Keepalive", "Kind",
    "Lease", "LocalProtocolError", "MetadataPush", "Payload", "Phase", "ProtocolError",
    "RemoteProtocolError", "Request", "RequestChannel", "RequestFnf", "RequestN",
    "RequestResponse", "RequestStream", "Resume", "ResumeOk", "ServerConnection",
    "Setup", "StreamError", "StreamInfo", "UnknownFrame", "add_tcp_length",
    "decode_frame", "encode_for", "encode_frame", "encode_tcp_frame", "error_frame",
    "fragment",
]
