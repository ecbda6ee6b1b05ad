"""What both versions' ``wire.py`` do alike around their own layouts: find a
frame's encoder, and put a frame on a transport (TCP with the version's
length prefix, WebSocket as it is)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Both versions run over a TCP byte stream and over WebSocket binary messages.
TRANSPORTS = ("tcp", "websocket")


def encode_by_type(
    encoders: Mapping[type[Any], Callable[[Any], bytes]],
    frame: object,
    what: str,
    error: type[Exception],
) -> bytes:
    """``frame`` by the encoder of its class; ``error`` (the version's
    LocalProtocolError) for anything that is not ``what``."""
    try:
        encoder = encoders[type(frame)]
    except KeyError:
        raise error(f"not {what}: {frame!r}") from None
    return encoder(frame)


def for_transport(
    encode_frame: Callable[[Any], bytes], add_tcp_length: Callable[[bytes], bytes]
) -> tuple[Callable[[Any], bytes], Callable[[str, Any], bytes]]:
    """``encode_tcp_frame(frame)`` (one frame with its TCP length prefix)
    and ``encode_for(transport, frame)`` from a version's codec."""

    def encode_tcp_frame(frame: Any) -> bytes:
        return add_tcp_length(encode_frame(frame))

    def encode_for(transport: str, frame: Any) -> bytes:
        message = encode_frame(frame)
        return add_tcp_length(message) if transport == "tcp" else message

    return encode_tcp_frame, encode_for
