"""TLS on every TCP listener and the HTTP port (gateway/transports/tls.py): each
protocol's own client over TLS, plain clients on TLS-only and dual ports,
untrusted client certificates, certificate login, SIGHUP reload, and the
checks ``polyport serve`` makes on the material."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from polyport.gateway.config import ConfigError, TlsOptions, load_config
from polyport.gateway.process.fatal import describe
from polyport.gateway.transports.tls import check_material, looks_like_tls, server_context
from polyport.protocols.bson import client as bson_client
from polyport.protocols.bson.client import BsonClient
from polyport.protocols.micromsg2 import client as mm2_client
from polyport.protocols.micromsg2.client import MicroMsg2Client
from polyport.protocols.reactive import client as reactive_client
from polyport.protocols.reactivesocket.client import NewEvent, ReactiveSocketClient
from polyport.protocols.rsocket.client import RSocketClient
from polyport.protocols.segment import client as segment_client
from polyport.protocols.segment.client import SegmentReader, SegmentWriter
from tests.tlspki import Pki, write_pair

pytestmark = pytest.mark.timeout(120)

CTX = "tls"
USER = "alice"
PROTOCOLS = ("bson", "reactivesocket", "rsocket", "micromsg2", "segment")
# What each client raises when the server drops it for its certificate.
CERTIFICATE_REFUSED: dict[str, type[Exception]] = {
    "bson": bson_client.ConnectionClosed,
    "reactivesocket": reactive_client.ConnectionClosed,
    "rsocket": reactive_client.ConnectionClosed,
    "micromsg2": mm2_client.ConnectionClosed,
    "segment": segment_client.ConnectionLost,
}


def tls_options(pki: Pki, **kw: Any) -> TlsOptions:
    return replace(TlsOptions(str(pki.cert), str(pki.key), str(pki.ca_file)), **kw)


async def start(
    gateway_factory: Callable[..., Awaitable[Any]], pki: Pki, anonymous: bool = False, **kw: Any
) -> Any:
    """A gateway with TLS on every listener; anonymous off, so a write that
    succeeds without a password came in as the certificate's user."""
    gw = await gateway_factory(tls=tls_options(pki, **kw), allow_anonymous=anonymous)
    await gw.store.users.add(USER, "secret-pw", default_context=CTX, contexts=[CTX])
    return gw


async def roundtrip(
    gw: Any, protocol: str, client_ssl: ssl.SSLContext | None, *, password: bool = False
) -> bytes:
    """Append one event with the protocol's own client and read it back
    through the same protocol; returns the body read."""
    stream = f"s-{protocol}-{uuid.uuid4().hex[:8]}"
    body = f"body of {stream}".encode()
    host, port = gw.listeners[protocol].address
    creds: dict[str, str] = {}
    if protocol == "bson":
        if password:
            creds = {"username": USER, "password": "secret-pw"}
        async with await BsonClient.connect(host, port, ssl=client_ssl, timeout=10,
                                            **creds) as c:
            await c.emit(stream, "t", {"data": body})
            sub = await c.subscribe(stream, start_seq=0)
            got = await sub.next(10)
            assert got is not None
            return bytes(got.event["data"])
    if protocol in ("reactivesocket", "rsocket"):
        if password:
            creds = {"user": USER, "password": "secret-pw"}
        rs: Any
        if protocol == "reactivesocket":
            rs = await ReactiveSocketClient.connect(host, port, ssl=client_ssl, **creds)
        else:
            rs = await RSocketClient.connect(host, port, ssl=client_ssl, **creds)
        try:
            await asyncio.wait_for(rs.append(stream, [NewEvent("t", body)]), 10)
            [event] = await asyncio.wait_for(rs.read(stream), 10)
            return bytes(event.body)
        finally:
            await rs.close()
    if protocol == "micromsg2":
        if password:
            creds = {"user": USER, "password": "secret-pw"}
        mm = await MicroMsg2Client.connect(host, port, ssl=client_ssl,
                                           required=["pubsub", "ack"], **creds)
        try:
            await mm.subscribe(f"topic/{stream}")
            await mm.publish(f"topic/{stream}", body, {"type": "t"})
            await mm.flush(timeout=10)
            return bytes((await mm.receive(timeout=10)).payload)
        finally:
            await mm.close()
    assert protocol == "segment"
    # Segment wire carries no password: without a certificate, anonymous.
    segment = f"{CTX if client_ssl is not None else 'default'}/{stream}"
    writer = await SegmentWriter.connect(host, port, ssl=client_ssl)
    try:
        appender = await writer.open_segment(segment)
        await appender.append([body])
        await appender.flush(10)
    finally:
        await writer.close()
    reader = await SegmentReader.connect(host, port, ssl=client_ssl)
    try:
        return (await reader.read_to_tail(segment))[8:]  # after the 8-byte event header
    finally:
        await reader.close()


async def plain_refused(gw: Any, protocol: str) -> bool:
    """A plain client's first bytes get the connection closed, no reply."""
    host, port = gw.listeners[protocol].address
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"\x00\x00\x00\x20plain, not a TLS ClientHello....")
        await writer.drain()
        return await asyncio.wait_for(reader.read(100), 10) == b""
    except ConnectionError:
        return True
    finally:
        writer.close()


# --- every TCP protocol -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_tls_client_certificate_login_and_refusals(
    gateway_factory: Any, pki: Pki, protocol: str
) -> None:
    gw = await start(gateway_factory, pki)
    # A certificate naming the user: no password in the protocol.
    body = await roundtrip(gw, protocol, pki.client(USER))
    assert body.startswith(b"body of s-")
    # A password login over TLS (no client certificate) works as well.
    if protocol != "segment":  # segment wire has no password
        assert (await roundtrip(gw, protocol, pki.client(), password=True)).startswith(b"body")
    # Plain bytes on a TLS-only port: closed, counted.
    refused = gw.listeners[protocol].stats.connections_refused
    assert await plain_refused(gw, protocol)
    assert gw.listeners[protocol].stats.connections_refused == refused + 1
    # A certificate from a CA the gateway does not trust: the handshake fails.
    other = trustme.CA()
    # The server refuses the certificate after the client's side of the TLS 1.3
    # handshake: each client sees its connection closed (or the TLS alert).
    with pytest.raises((CERTIFICATE_REFUSED[protocol], ssl.SSLError)):
        await asyncio.wait_for(roundtrip(gw, protocol, pki.client(USER, ca=other)), 15)
    assert gw.listeners[protocol].stats.connections_refused >= refused + 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_dual_mode_serves_plain_and_tls_on_one_port(
    gateway_factory: Any, pki: Pki, protocol: str
) -> None:
    gw = await start(gateway_factory, pki, anonymous=protocol == "segment", mode="dual")
    assert (await roundtrip(gw, protocol, pki.client(USER))).startswith(b"body of")
    assert (await roundtrip(gw, protocol, None, password=True)).startswith(b"body of")
    assert gw.listeners[protocol].stats.connections_refused == 0


async def test_unknown_certificate_user_is_refused(gateway_factory: Any, pki: Pki) -> None:
    gw = await start(gateway_factory, pki)
    host, port = gw.listeners["reactivesocket"].address
    rs = await ReactiveSocketClient.connect(host, port, ssl=pki.client("mallory"))
    try:
        with pytest.raises(Exception, match=r"mallory|unauthenticated"):
            await asyncio.wait_for(rs.append("s", [NewEvent("t", b"x")]), 10)
    finally:
        await rs.close()


# --- HTTPS and WSS ----------------------------------------------------------------------


async def test_https_and_wss(gateway_factory: Any, pki: Pki) -> None:
    gw = await start(gateway_factory, pki)
    assert gw.http_address is not None
    h, p = gw.http_address
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://{h}:{p}/healthz", ssl=pki.client()) as resp:
            assert resp.status == 200
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://{h}:{p}/healthz") as resp:
                await resp.read()
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"https://{h}:{p}/healthz",
                                ssl=pki.client(USER, ca=trustme.CA())) as resp:
                await resp.read()
    # WSS, logging in with the certificate: anonymous is off.
    for path, client in (("reactivesocket", ReactiveSocketClient), ("rsocket", RSocketClient)):
        c: Any = await client.connect_websocket(f"wss://{h}:{p}/{path}", ssl=pki.client(USER))
        try:
            await asyncio.wait_for(c.append(f"wss-{path}", [NewEvent("t", b"over wss")]), 10)
            [event] = await asyncio.wait_for(c.read(f"wss-{path}"), 10)
            assert event.body == b"over wss" and event.context == CTX
        finally:
            await c.close()


# --- SIGHUP -----------------------------------------------------------------------------


def _served_certificate(host: str, port: int, ctx: ssl.SSLContext) -> bytes:
    import socket

    with socket.create_connection((host, port)) as raw, ctx.wrap_socket(
        raw, server_hostname=host
    ) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


async def test_reload_keeps_open_connections_and_serves_the_new_certificate(
    gateway_factory: Any, pki: Pki
) -> None:
    gw = await start(gateway_factory, pki)
    host, port = gw.listeners["reactivesocket"].address
    loop = asyncio.get_running_loop()
    before = await loop.run_in_executor(None, _served_certificate, host, port, pki.client())
    open_client = await ReactiveSocketClient.connect(host, port, ssl=pki.client(USER))
    try:
        await asyncio.wait_for(open_client.append("hup", [NewEvent("t", b"1")]), 10)
        cert, key = pki.server_files("renewed")
        new = replace(gw.config, tls=replace(gw.config.tls, cert=str(cert), key=str(key)))
        assert set(gw.reload_tls(new)) >= set(PROTOCOLS) | {"http"}
        after = await loop.run_in_executor(None, _served_certificate, host, port, pki.client())
        assert after != before
        # The open connection goes on with its old session.
        await asyncio.wait_for(open_client.append("hup", [NewEvent("t", b"2")]), 10)
        assert len(await asyncio.wait_for(open_client.read("hup"), 10)) == 2
    finally:
        await open_client.close()
    # Bad new material is refused and the running certificate stays.
    bad = replace(gw.config, tls=replace(gw.config.tls, key=str(pki.key), cert=str(cert)))
    with pytest.raises(ConfigError, match="does not belong"):
        gw.reload_tls(bad)
    again = await loop.run_in_executor(None, _served_certificate, host, port, pki.client())
    assert again == after


# --- configuration and checks -------------------------------------------------------------


def test_tls_configuration_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "polyport.toml"
    toml.write_text(
        '[tls]\ncert = "/file.pem"\nkey = "/file.key"\nmin_version = 1.3\n'
        '[tls.bson]\nmode = "dual"\ncert = "/bson.pem"\n'
    )
    cfg = load_config(str(toml), env={"POLYPORT_TLS_KEY": "/env.key",
                                      "POLYPORT_SEGMENT_TLS": "off"},
                      overrides={"http_tls_min_version": "1.2"})
    assert cfg.tls_for("bson") == TlsOptions("/bson.pem", "/env.key", None, "1.3", "dual", "cn")
    assert cfg.tls_for("rsocket") == TlsOptions("/file.pem", "/env.key", None, "1.3",
                                                "required", "cn")
    assert cfg.tls_for("segment") is None
    assert cfg.tls_for("http") is not None and cfg.tls_for("http").min_version == "1.2"  # type: ignore[union-attr]
    assert cfg.tls_for("res01") is None
    assert load_config(env={}).tls_for("bson") is None  # no certificate: plain
    for bad, match in (
        ('[tls]\nmode = "sometimes"\n', "expected one of off, required, dual"),
        ('[tls]\ncertificate = "x"\n', "unknown key tls.certificate"),
        ('[tls.bson]\nkey_file = "x"\n', "unknown key tls.bson.key_file"),
    ):
        toml.write_text(bad)
        with pytest.raises(ConfigError, match=match):
            load_config(str(toml), env={})


def test_serve_refuses_bad_material_with_one_line(pki: Pki, tmp_path: Path) -> None:
    good = TlsOptions(str(pki.cert), str(pki.key))
    check_material("bson", good)
    server_context("bson", good)
    loose_cert, loose_key = write_pair(tmp_path, "loose", pki.ca.issue_cert("127.0.0.1"))
    loose_key.chmod(0o644)
    old_cert, old_key = write_pair(tmp_path, "old", pki.ca.issue_cert(
        "127.0.0.1", not_before=datetime.now(UTC) - timedelta(days=30),
        not_after=datetime.now(UTC) - timedelta(days=1),
    ))
    for options, match in (
        (TlsOptions(str(loose_cert), str(loose_key)), "readable by other users .*chmod 600"),
        (TlsOptions(str(old_cert), str(old_key)), "expired on"),
        (TlsOptions(str(pki.cert), str(old_key)), "does not belong to certificate"),
        (TlsOptions(str(pki.cert), str(tmp_path / "none.key")), "does not exist"),
    ):
        with pytest.raises(ConfigError, match=match) as info:
            server_context("bson", options)
        line = describe(info.value)
        assert "\n" not in line and line.startswith("bson: TLS")


def test_tls_is_told_from_every_protocols_first_bytes(pki: Pki) -> None:
    """The dual-mode signature against real first frames and a real ClientHello."""
    import bson

    from polyport.protocols.micromsg2.connection import ClientConnection as MmClient
    from polyport.protocols.micromsg2.wire import encode_handshake
    from polyport.protocols.rsocket.frames import Setup
    from polyport.protocols.rsocket.wire import encode_setup

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    hello_obj = pki.client().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        hello_obj.do_handshake()
    assert looks_like_tls(outgoing.read())
    # A BSON CONNECT whose length is 22 mod 256 starts with 0x16 too.
    connect = bson.encode({"type": "CONNECT", "frame": {"version": "1.0",
                                                        "password": "p" * 200}})
    pad = (0x16 - len(connect)) % 256
    connect = bson.encode({"type": "CONNECT", "frame": {"version": "1.0",
                                                        "password": "p" * (200 + pad)}})
    assert connect[0] == 0x16 and not looks_like_tls(connect)
    # An RSocket SETUP of 0x1603xx bytes: the stream id (0) tells it apart.
    empty = encode_setup(Setup(30_000, 90_000, "application/json", "application/json"))
    setup = encode_setup(Setup(30_000, 90_000, "application/json", "application/json",
                               None, b"x" * (0x160301 - len(empty))))
    framed = len(setup).to_bytes(3, "big") + setup
    assert framed[:3] == b"\x16\x03\x01" and not looks_like_tls(framed)
    hello = encode_handshake(MmClient("id", [], []).hello_frame())
    assert not looks_like_tls(hello)
    assert not looks_like_tls(b"GET / HTTP/1.1\r\n")
