"""Segment wire: the append/read protocol of a segment store (spec:
specs/segment-wire.md), as a sans-IO codec.  See docs/protocols/segment.md."""

from polyport.protocols.segment.client import AppendWriter, block_frames, encode_block
from polyport.protocols.segment.connection import (
    ClientConnection,
    ClientInput,
    ServerConnection,
    ServerInput,
)
from polyport.protocols.segment.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    error_reply,
)
from polyport.protocols.segment.frames import (
    DEFAULT_PORT,
    PROTOCOL,
    AppendSetup,
    AuthFailed,
    BeginAppendBlock,
    DataAppended,
    EndAppendBlock,
    ErrorMessage,
    Event,
    Frame,
    KeepAlive,
    NoSuchSegment,
    PartialKind,
    PartialMessage,
    ReadSegment,
    SegmentRead,
    SetupAppend,
)
from polyport.protocols.segment.state import BlockEvents, BlockState
from polyport.protocols.segment.wire import decode_frame, encode_frame, split_segment_name

__all__ = [
    "DEFAULT_PORT",
    "PROTOCOL",
    "AppendSetup",
    "AppendWriter",
    "AuthFailed",
    "BeginAppendBlock",
    "BlockEvents",
    "BlockState",
    "ClientConnection",
    "ClientInput",
    "DataAppended",
    "EndAppendBlock",
    "ErrorMessage",
    "Event",
    "Frame",
    "KeepAlive",
    "LocalProtocolError",
    "NoSuchSegment",
    "PartialKind",
    "PartialMessage",
    "ProtocolError",
    "ReadSegment",
    "RemoteProtocolError",
    "SegmentRead",
    "ServerConnection",
    "ServerInput",
    "SetupAppend",
    "block_frames",
    "decode_frame",
    "encode_block",
    "encode_frame",
    "error_reply",
    "split_segment_name",
]
