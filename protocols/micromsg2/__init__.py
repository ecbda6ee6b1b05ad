"""MicroMsg2: sans-IO codec (frames, handshake negotiation, acks, filters)."""

from polyport.protocols.micromsg2.acks import AckWindow, decode_ack_payload, encode_ack_payload
from polyport.protocols.micromsg2.connection import ClientConnection, ServerConnection
from polyport.protocols.micromsg2.errors import (
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    error_frame,
)
from polyport.protocols.micromsg2.filters import (
    Condition,
    Filter,
    decode_properties,
    encode_properties,
    format_value,
    parse_filter,
    parse_value,
)
from polyport.protocols.micromsg2.frames import (
    DEFAULT_PORT,
    PROTOCOL,
    Ack,
    Command,
    Error,
    Extension,
    ExtensionSpec,
    Frame,
    Handshake,
    Message,
    PropertyValue,
)
from polyport.protocols.micromsg2.negotiation import Negotiated, NegotiatedExtension
from polyport.protocols.micromsg2.pubsub import (
    Destination,
    Subscribe,
    Unsubscribe,
    parse_pubsub_command,
    to_command,
)
from polyport.protocols.micromsg2.state import State
from polyport.protocols.micromsg2.wire import (
    decode_frame,
    decode_handshake,
    encode_frame,
    encode_handshake,
)

__all__ = [
    "DEFAULT_PORT",
    "PROTOCOL",
    "Ack",
    "AckWindow",
    "ClientConnection",
    "Command",
    "Condition",
    "Destination",
    "Error",
    "Extension",
    "ExtensionSpec",
    "Filter",
    "Frame",
    "Handshake",
    "LocalProtocolError",
    "Message",
    "Negotiated",
    "NegotiatedExtension",
    "PropertyValue",
    "ProtocolError",
    "RemoteProtocolError",
    "ServerConnection",
    "State",
    "Subscribe",
    "Unsubscribe",
    "decode_ack_payload",
    "decode_frame",
    "decode_handshake",
    "decode_properties",
    "encode_ack_payload",
    "encode_frame",
    "encode_handshake",
    "encode_properties",
    "error_frame",
    "format_value",
    "parse_filter",
    "parse_pubsub_command",
    "parse_value",
    "to_command",
]
