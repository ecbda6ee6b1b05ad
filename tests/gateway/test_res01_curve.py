"""Res01 over ZeroMQ CURVE (gateway/transports/curve.py): registered client keys are
served, unknown keys and NULL sockets get nothing, the wire is encrypted, and
``polyport keys`` creates key pairs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from polyport.gateway.cli.commands import _keys
from polyport.gateway.cli.parser import build_parser
from polyport.gateway.config import ConfigError, GatewayConfig
from polyport.gateway.transports.curve import KEY_FILE, new_key_pair, server_keys
from polyport.protocols.res01.client import CurveClientKeys, Res01Client, new_event

pytestmark = pytest.mark.timeout(120)

BODY = '{"secret-body": "plaintext-marker-1234567890"}'


async def curve_gateway(gateway_factory: Any, tmp_path: Path) -> tuple[Any, CurveClientKeys]:
    gw = await gateway_factory(res01_curve=True, data_dir=str(tmp_path))
    await gw.store.users.add("carol", "pw")
    keys = new_key_pair()
    await gw.store.users.add_curve_key("carol", keys.public)
    server_public = gw.listeners["res01"].curve.public_key
    return gw, CurveClientKeys(server_public, keys.public, keys.secret)


async def commit_and_read(address: Any, curve: CurveClientKeys | None, timeout: float) -> int:
    async with await Res01Client.connect(address, timeout=timeout, curve=curve) as c:
        await c.commit("default", "curved", -1, [new_event("T", BODY)])
        start = datetime.now(UTC) - timedelta(hours=1)
        [sub] = await c.subscribe("curve-reader", [("default", "curved", start)])
        [batch] = await c.fetch([(sub, 10)])
        assert all(e.body == BODY for e in batch.events)
        return len(batch.events)


async def test_registered_key_served_unknown_and_null_get_nothing(
    gateway_factory: Any, tmp_path: Path
) -> None:
    gw, curve = await curve_gateway(gateway_factory, tmp_path)
    address = gw.listeners["res01"].address
    assert await commit_and_read(address, curve, 10) == 1
    # The server key went to the data directory, 0600.
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o077 == 0
    stranger = new_key_pair()
    unknown = CurveClientKeys(curve.server_public, stranger.public, stranger.secret)
    for keys in (unknown, None):  # an unregistered key pair; a NULL-mechanism socket
        with pytest.raises(TimeoutError):
            await commit_and_read(address, keys, 1.5)
    # Only the first client's event is stored.
    assert [e.body for e in await gw.store.read_stream(_read("curved"))] == [BODY.encode()]


def _read(stream: str) -> Any:
    from polyport.core.commands import ReadStream

    return ReadStream("default", stream)


async def test_wire_is_not_plaintext(gateway_factory: Any, tmp_path: Path) -> None:
    """Every byte between client and server goes through a loopback proxy;
    the event body is nowhere in them."""
    gw, curve = await curve_gateway(gateway_factory, tmp_path)
    host, port = gw.listeners["res01"].address
    captured = bytearray()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                captured.extend(data)
                writer.write(data)
                await writer.drain()
        writer.close()

    async def proxy(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(host, port)
        await asyncio.gather(pipe(cr, sw), pipe(sr, cw))

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    try:
        proxy_port = server.sockets[0].getsockname()[1]
        assert await commit_and_read(("127.0.0.1", proxy_port), curve, 10) == 1
    finally:
        server.close()
    assert len(captured) > len(BODY)
    assert b"plaintext-marker" not in captured and b"curved" not in captured


def test_server_key_file_checks(tmp_path: Path) -> None:
    cfg = GatewayConfig(data_dir=str(tmp_path), res01_curve=True)
    first = server_keys(cfg)
    assert server_keys(cfg) == first  # generated once, then read back
    (tmp_path / KEY_FILE).chmod(0o644)
    with pytest.raises(ConfigError, match="readable by other users"):
        server_keys(cfg)
    missing = GatewayConfig(res01_curve_key_file=str(tmp_path / "nope.key"))
    with pytest.raises(ConfigError, match="does not exist"):
        server_keys(missing)


async def test_keys_cli_prints_the_secret_once_and_stores_the_public_key(
    store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    await store.users.add("dave", "pw")
    args = build_parser().parse_args(["keys", "create", "dave"])
    assert await _keys(args, store) == 0
    out = capsys.readouterr().out
    public = out.split("public key: ")[1].split()[0]
    secret = out.split("secret key: ")[1].split()[0]
    assert zmq.curve_public(secret.encode()).decode() == public
    [row] = await store.users.curve_keys()
    assert row["public_key"] == public and row["user_name"] == "dave"
    assert secret not in repr(row)
    assert await store.users.curve_key_user(public) == "dave"
    await _keys(argparse.Namespace(action="remove", public_key=public), store)
    assert await store.users.curve_key_user(public) is None
