"""Shared helpers of the ReactiveSocket tests."""

from __future__ import annotations

from polyport.protocols.reactivesocket import ClientConnection, ServerConnection, encode_frame
from polyport.protocols.reactivesocket.frames import Frame


def h(text: str) -> bytes:
    """Hex with spaces and line breaks allowed."""
    return bytes.fromhex("".join(text.split()))


def tcp(frame: Frame) -> bytes:
    message = encode_frame(frame)
    return (len(message) + 4).to_bytes(4, "big") + message


SETUP_TCP = h("00000010 00 00 0001 0000000000000000")
SETUP_WS = h("00 00 0001 0000000000000000")


def open_server(transport: str = "tcp", **kwargs: int) -> ServerConnection:
    server = ServerConnection(transport, **kwargs)  # type: ignore[arg-type]
    assert server.receive_data(SETUP_TCP if transport == "tcp" else SETUP_WS)
    return server


def open_pair(transport: str = "tcp", **kwargs: int) -> tuple[ClientConnection, ServerConnection]:
    client = ClientConnection(transport, **kwargs)  # type: ignore[arg-type]
    server = ServerConnection(transport, **kwargs)  # type: ignore[arg-type]
    assert server.receive_data(client.setup())
    return client, server


def deliver(target: ClientConnection | ServerConnection, chunks: list[bytes]) -> list:
    """Feed frames as the transport would: one call per chunk (one WebSocket
    message each, or TCP reads)."""
    out: list = []
    for chunk in chunks:
        if chunk:
            out.extend(target.receive_data(chunk))
    return out
