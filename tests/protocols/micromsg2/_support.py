"""Helpers shared by the MicroMsg2 codec tests (no sockets)."""

from __future__ import annotations

from collections.abc import Iterable

from polyport.protocols.micromsg2 import ClientConnection, ExtensionSpec, ServerConnection
from polyport.protocols.micromsg2.frames import DEFAULT_MAX_PAYLOAD, SERVER_EXTENSIONS


def run_handshake(server: ServerConnection, client: ClientConnection) -> None:
    server.receive_data(client.send(client.hello_frame()))
    client.receive_data(server.send(server.reply_frame()))
    server.receive_data(client.send(client.final_frame()))


def open_pair(
    *,
    supported: Iterable[str | ExtensionSpec] = SERVER_EXTENSIONS,
    server_required: Iterable[str | ExtensionSpec] = (),
    required: Iterable[str | ExtensionSpec] = (),
    optional: Iterable[str | ExtensionSpec] = (),
    client_supported: Iterable[str] = (),
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> tuple[ServerConnection, ClientConnection]:
    server = ServerConnection("polyport", supported, server_required, max_payload=max_payload)
    client = ClientConnection(
        "test", required, optional, supported=client_supported, max_payload=max_payload
    )
    run_handshake(server, client)
    return server, client
