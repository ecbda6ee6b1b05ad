"""ReactiveSocket (draft spec, version 0): sans-IO wire codec and connection objects.

See docs/protocols/reactivesocket.md for layouts, state machines and decisions.
"""

from polyport.protocols.reactivesocket.connection import (
    ClientConnection,
    Event,
    ServerConnection,
    StreamError,
    error_frame,
)
from polyport.protocols.reactivesocket.errors import (
    LocalProtocolError,
    PayloadError,
    ProtocolError,
    RemoteProtocolError,
)
from polyport.protocols.reactivesocket.fragments import fragment
from polyport.protocols.reactivesocket.frames import (
    DEFAULT_PORT,
    PROTOCOL,
    WEBSOCKET_PATH,
    Cancel,
    ErrorFrame,
    Ext,
    Frame,
    Request,
    RequestFnf,
    RequestN,
    RequestResponse,
    RequestStream,
    RequestSub,
    Response,
    Setup,
    UnknownFrame,
)
from polyport.protocols.reactivesocket.state import ConnectionState, Kind, Phase, StreamInfo
from polyport.protocols.reactivesocket.wire import (
    decode_frame,
    encode_for,
    encode_frame,
    encode_tcp_frame,
    split_tcp_frames,
)

__all__ = [
    "DEFAULT_PORT", "PROTOCOL", "WEBSOCKET_PATH", "Cancel", "ClientConnection",
    "ConnectionState", "ErrorFrame", "Event", "Ext", "Frame", "Kind",
    "LocalProtocolError", "PayloadError", "Phase", "ProtocolError",
    "RemoteProtocolError", "Request", "RequestFnf", "RequestN", "RequestResponse",
    "RequestStream", "RequestSub", "Response", "ServerConnection", "Setup",
    "StreamError", "StreamInfo", "UnknownFrame", "decode_frame", "encode_for",
    "encode_frame", "encode_tcp_frame", "error_frame", "fragment", "split_tcp_frames",
]
