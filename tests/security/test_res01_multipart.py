"""A Res01 peer's unfinished multipart message (issue 27, item 2).

libzmq keeps every part of a message until its last one arrives (a pipe
counts whole messages against RCVHWM, and ZMQ_MAXMSGSIZE bounds one frame),
so nothing in the gateway sees those bytes or can bound them.  What does
bound them is who may finish the ZeroMQ handshake: with
``res01_allow_from`` the ZAP handler refuses a peer from another network
before libzmq reads a message from it.  Real gateway, and a raw ZMTP 3.0
peer that sends parts with MORE and never the last one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polyport.gateway.config import ConfigError, load_config
from polyport.gateway.listeners.res01 import warn_if_open_to_everyone
from polyport.protocols.res01.client import Res01Client, new_event
from tests.memory import resident_bytes

pytestmark = pytest.mark.timeout(120)

GatewayFactory = Callable[..., Awaitable[Any]]
MIB = 1 << 20
PARTS = 64

# ZMTP 3.0 (RFC 23): greeting with the NULL mechanism, then READY as a DEALER.
GREETING = (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
            + b"\x00" + b"\x00" * 31)
_READY_BODY = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
READY = b"\x04" + bytes([len(_READY_BODY)]) + _READY_BODY
# A long frame with MORE: another part always follows.
PART = b"\x03" + struct.pack(">Q", MIB) + b"p" * MIB


async def _server_ready(reader: asyncio.StreamReader) -> bool:
    """The server's greeting and first command: READY (the handshake is
    complete, as a real client waits for) or not (ERROR, or closed)."""
    try:
        await reader.readexactly(len(GREETING))
        flags, size = await reader.readexactly(2)
        if flags & 0x02:  # a long command: not READY
            return False
        return (await reader.readexactly(size)).startswith(b"\x05READY")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False


async def _endless_message(host: str, port: int) -> int:
    """After the handshake, PARTS parts of 1 MiB, all with MORE; the bytes
    the gateway took (0: the handshake was refused)."""
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    try:
        writer.write(GREETING + READY)
        if not await asyncio.wait_for(_server_ready(reader), 10):
            return 0
        for _ in range(PARTS):
            writer.write(PART)
            await asyncio.wait_for(writer.drain(), 5)
            sent += len(PART)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return sent


async def test_peers_outside_res01_allow_from_cannot_send_a_message(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(res01_allow_from=("127.0.0.2/32",))
    host, port = gw.listeners["res01"].address
    before = resident_bytes()
    sent = await _endless_message(host, port)
    grown = resident_bytes() - before
    # Refused at the handshake (ZAP 400 on its NULL mechanism): not one part
    # reached libzmq's pipe, where 64 MiB would wait for the last part.
    assert sent == 0
    assert grown < 16 * MIB, f"RSS grew {grown / MIB:.1f} MiB"
    assert gw.listeners["res01"].stats.errors["unauthenticated"] >= 1

    # A client from an allowed address is served.
    client = await Res01Client.connect(f"tcp://127.0.0.2:0;{host}:{port}", timeout=10)
    try:
        await client.commit("default", "allowed", -1, [new_event("t", "{}")])
    finally:
        await client.close()


def test_res01_allow_from_is_read_as_networks() -> None:
    cfg = load_config(env={"POLYPORT_RES01_ALLOW_FROM": "10.1.2.3, 192.168.0.0/16, ::1"})
    assert cfg.res01_allow_from == ("10.1.2.3/32", "192.168.0.0/16", "::1/128")
    assert load_config(env={}).res01_allow_from == ()
    with pytest.raises(ConfigError, match=r"'10.0.0.0/33' is not an IP network"):
        load_config(env={"POLYPORT_RES01_ALLOW_FROM": "10.0.0.0/33"})


def test_a_res01_listener_open_to_every_address_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="polyport.res01"):
        warn_if_open_to_everyone("127.0.0.1", ())
        warn_if_open_to_everyone("0.0.0.0", ("10.0.0.0/8",))
        assert caplog.records == []
        warn_if_open_to_everyone("0.0.0.0", ())
    [record] = caplog.records
    assert "res01_allow_from" in record.getMessage()
    assert "without limit" in record.getMessage()
