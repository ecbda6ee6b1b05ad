"""TLS for the byte-stream listeners and the HTTP port.

- :func:`check_material` refuses, with one line each, a key file other users
  may read, a certificate that is expired (or not yet valid), and a key that
  does not belong to the certificate.
- :class:`ServerTls` holds a listener's ``ssl.SSLContext``.  :meth:`ServerTls.reload`
  builds a *fresh* context from the files (certificate, key and the client
  CA bundle read again) and every new handshake switches to it from the
  listener's context's ``sni_callback`` (called for every ClientHello, SNI
  or not): the listeners keep the object they were started with (aiohttp
  and asyncio servers hold it), open connections keep their sessions, and
  a CA taken out of the bundle stops being trusted, which loading more into
  the running context could never do (SIGHUP, ``Gateway.reload_tls``).
- :func:`serve_tls` is the accept loop of a TLS listener.  It accepts plain
  sockets itself so that it can look at the first bytes before asyncio reads
  anything: in ``dual`` mode a TLS ClientHello is wrapped, anything else goes
  to the protocol as plain bytes; in ``required`` mode a plain client is
  closed at once (no TLS alert sent to a peer that cannot read one).  Each
  connection counts against the listener's connection limits from the
  moment it is accepted, not from the end of its handshake: connections
  that never send a ClientHello cannot pile up past ``max_connections``.

Telling TLS from the protocols (``dual``): a TLS record starts with content
type 22 (0x16, handshake), version major 3 and minor 1..4, a two-byte length,
then handshake type 1 (ClientHello); :func:`looks_like_tls` checks those six
bytes.  What a plaintext first frame starting that way would have to be:

- ReactiveSocket draft: a 31-bit frame length >= 0x16030100 (369 MB), over
  its 16 MiB frame limit; and SETUP's stream id is 0, not byte 5 = 1.
- RSocket 1.0: a 24-bit length 0x1603xx (~1.4 MB) is possible, but byte 5
  is inside the stream id, which is 0 in SETUP and RESUME (the only legal
  first frames), never 1.
- MicroMsg2: the first byte is the handshake's major version (1).
- Segment wire: the first 4 bytes are a big-endian type code; 0x1603.... is
  no type.
- BSON: the first byte is the low byte of the document's little-endian length,
  so 0x16 alone is possible (length 22 mod 256).  With the six bytes the frame
  would be at least 66,326 bytes long *and* its first element name would
  start with byte 0x01 (every client writes ``type`` or ``frame``): no CONNECT
  looks like that.  This is why one byte is not enough and six are read.
- HTTP: a request line starts with a method letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from polyport.gateway.config import ConfigError, TlsOptions, check_private_file

log = logging.getLogger("polyport.tls")

# Bytes that decide dual mode.
SNIFF_BYTES = 6
# How long a client may take to send them and finish the TLS handshake,
# where the gateway's handshake_timeout is off.
HANDSHAKE_TIMEOUT = 10.0
STREAM_LIMIT = 2**16  # asyncio's default StreamReader limit

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


# --- checking the material ------------------------------------------------------


def _pem_certificates(path: Path) -> list[bytes]:
    text = path.read_text(errors="replace")
    out = []
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    while begin in text:
        start = text.index(begin)
        stop = text.index(end, start) + len(end)
        out.append(ssl.PEM_cert_to_DER_cert(text[start:stop]))
        text = text[stop:]
    return out


def _der(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at ``at``."""
    tag, length = data[at], data[at + 1]
    start = at + 2
    if length & 0x80:
        n = length & 0x7F
        length = int.from_bytes(data[start : start + n], "big")
        start += n
    return tag, start, start + length


def _der_time(tag: int, raw: bytes) -> datetime:
    text = raw.decode("ascii").rstrip("Z")
    if tag == 0x17:  # UTCTime: YYMMDDHHMMSS, years 1950..2049
        year = int(text[:2])
        text = f"{year + (1900 if year >= 50 else 2000)}{text[2:]}"
    return datetime.strptime(text[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)


def certificate_validity(der: bytes) -> tuple[datetime, datetime]:
    """(notBefore, notAfter) of a DER certificate.  The ``ssl`` module has no
    public parser and ``cryptography`` is not a dependency: walk the few DER
    elements before the validity (RFC 5280 4.1)."""
    _tag, cert_start, _ = _der(der, 0)
    _tag, at, _ = _der(der, cert_start)  # tbsCertificate
    tag, _s, end = _der(der, at)
    if tag == 0xA0:  # [0] version
        at = end
    for _skip in range(3):  # serialNumber, signature, issuer
        _tag, _s, at = _der(der, at)
    _tag, at, _ = _der(der, at)  # validity
    tag_a, s_a, e_a = _der(der, at)
    tag_b, s_b, _e = _der(der, e_a)
    return _der_time(tag_a, der[s_a:e_a]), _der_time(tag_b, der[s_b:_e])


def check_material(listener: str, options: TlsOptions, now: datetime | None = None) -> None:
    """Refuse material the listener must not start with: ConfigError, one line."""
    if options.cert is None:
        return
    if options.key is None:
        raise ConfigError(f"{listener}: TLS certificate {options.cert} has no key: set tls key")
    cert, key = Path(options.cert), Path(options.key)
    for what, path in (("certificate", cert), ("key", key)):
        if not path.is_file():
            raise ConfigError(f"{listener}: TLS {what} file {path} does not exist")
    check_private_file(key, f"{listener}: TLS key file")
    try:
        chain = _pem_certificates(cert)
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"{listener}: {cert} is not a PEM certificate: {exc}") from None
    if not chain:
        raise ConfigError(f"{listener}: {cert} holds no PEM certificate")
    try:
        not_before, not_after = certificate_validity(chain[0])
    except (ValueError, IndexError):
        raise ConfigError(f"{listener}: cannot read the validity of {cert}") from None
    now = now or datetime.now(UTC)
    if not_after < now:
        raise ConfigError(
            f"{listener}: TLS certificate {cert} expired on {not_after:%Y-%m-%d %H:%M} UTC; "
            "renew it"
        )
    if not_before > now:
        raise ConfigError(
            f"{listener}: TLS certificate {cert} is not valid before "
            f"{not_before:%Y-%m-%d %H:%M} UTC"
        )
    if options.client_ca is not None and not Path(options.client_ca).is_file():
        raise ConfigError(f"{listener}: TLS client CA file {options.client_ca} does not exist")


def _load(context: ssl.SSLContext, listener: str, options: TlsOptions) -> None:
    assert options.cert is not None and options.key is not None
    try:
        context.load_cert_chain(options.cert, options.key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"{listener}: TLS key {options.key} does not belong to certificate "
                f"{options.cert}"
            ) from None
        raise ConfigError(
            f"{listener}: cannot load TLS certificate {options.cert} with key {options.key}: "
            f"{exc.reason or exc}"
        ) from None
    context.minimum_version = _VERSIONS[options.min_version or "1.2"]
    if options.client_ca is not None:
        try:
            context.load_verify_locations(cafile=options.client_ca)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"{listener}: cannot load TLS client CA {options.client_ca}: {exc.reason or exc}"
            ) from None
        # Optional: a client without a certificate logs in with a password; one
        # whose certificate the CA did not sign fails the handshake.
        context.verify_mode = ssl.CERT_OPTIONAL


def server_context(listener: str, options: TlsOptions) -> ssl.SSLContext:
    check_material(listener, options)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load(context, listener, options)
    return context


# --- the certificate's user -----------------------------------------------------------

_SAN_KINDS = {"san-email": "email", "san-dns": "DNS", "san-uri": "URI"}


def certificate_user(peercert: dict[str, Any] | None, user_from: str) -> str | None:
    """The polyport user a verified client certificate names, or None."""
    if not peercert:
        return None
    if user_from == "cn":
        for rdn in peercert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return None
    kind = _SAN_KINDS[user_from]
    for key, value in peercert.get("subjectAltName", ()):
        if key == kind:
            return str(value)
    return None


def transport_user(transport: asyncio.BaseTransport | None, user_from: str) -> str | None:
    """The certificate user of an accepted TLS connection (None: plain, or no
    client certificate).  ``getpeercert`` holds only certificates the client
    CA verified; without a client CA none are asked for."""
    if transport is None:
        return None
    sslobj = transport.get_extra_info("ssl_object")
    if sslobj is None:
        return None
    return certificate_user(sslobj.getpeercert(), user_from)


# --- one listener's TLS ---------------------------------------------------------------


class ServerTls:
    """A listener's TLS context and mode; :meth:`reload` swaps the material."""

    def __init__(self, listener: str, options: TlsOptions) -> None:
        self.listener = listener
        self.options = options
        # The context the listener holds; each handshake moves to _current.
        self.context = server_context(listener, options)
        self._current = self.context
        self.context.sni_callback = self._switch

    def _switch(self, sslobj: ssl.SSLObject, _server_name: str | None,
                context: ssl.SSLContext) -> None:
        if self._current is not context:
            sslobj.context = self._current

    @property
    def mode(self) -> str:
        return self.options.mode or "required"

    @property
    def user_from(self) -> str:
        return self.options.user_from or "cn"

    def reload(self, options: TlsOptions) -> None:
        """New connections get ``options``' certificate and key and the client
        CA bundle as its file says now, in a fresh context; bad material
        leaves the running one as it was (ConfigError).  The mode, the
        bundle's path, whether client certificates are asked for at all,
        and the minimum version need a restart."""
        options = TlsOptions(
            options.cert, options.key, self.options.client_ca, self.options.min_version,
            self.options.mode, self.options.user_from,
        )
        self._current = server_context(self.listener, options)
        self.options = options


def looks_like_tls(head: bytes) -> bool:
    """Whether the first bytes of a connection are a TLS ClientHello record
    (see the module docstring for why no protocol's first frame is)."""
    return (
        len(head) >= SNIFF_BYTES
        and head[0] == 0x16
        and head[1] == 0x03
        and 1 <= head[2] <= 4
        and head[5] == 0x01
    )


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _readable(sock: socket.socket, deadline: float) -> bool:
    """Wait until ``sock`` is readable (data, EOF or an error); False when
    ``deadline`` (loop time) passes first."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(sock.fileno(), _set_once, ready)
    try:
        async with asyncio.timeout_at(deadline):
            await ready
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(sock.fileno())
    return True


def _low_water(sock: socket.socket, size: int) -> bool:
    """Set SO_RCVLOWAT: the socket then polls readable only once ``size``
    bytes are buffered (or at EOF or an error).  False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)
    except OSError:
        return False
    return True


async def _peek(sock: socket.socket, deadline: float) -> bytes:
    """Up to SNIFF_BYTES the client sent, without consuming them.  Returns as
    soon as the first byte rules TLS out; b"" on EOF or when ``deadline``
    (loop time) passes.

    Peeked bytes stay in the socket, so it stays readable: waiting again
    for the rest of a ClientHello's header would wake at once, for ever.
    Once the first byte is 0x16 the socket's low-water mark is raised to
    SNIFF_BYTES instead, and the next wake-up comes with all six (every
    first frame starting with 0x16 is longer than that, see the module
    docstring); the mark goes back to 1 before the socket is handed on."""
    raised = False
    try:
        while await _readable(sock, deadline):
            try:
                head = sock.recv(SNIFF_BYTES, socket.MSG_PEEK)
            except BlockingIOError:
                continue
            if not head or head[0] != 0x16 or len(head) >= SNIFF_BYTES:
                return head
            if raised:
                # Readable below the mark: the peer ended (or broke) the
                # connection inside a record header.
                return b""
            raised = _low_water(sock, SNIFF_BYTES)
            if not raised:
                # No SO_RCVLOWAT on this system: wait a little between looks.
                await asyncio.sleep(0.005)
        return b""
    finally:
        if raised:
            _low_water(sock, 1)


# (reader, writer, the source address the connection was admitted under).
Accepted = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]


@dataclass
class TlsServer:
    """What :class:`asyncio.Server` offers TcpListener: sockets and close."""

    sockets: list[socket.socket]
    task: asyncio.Task[None]
    handlers: set[asyncio.Task[None]]

    def close(self) -> None:
        self.task.cancel()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _open_streams(
    conn: socket.socket, where: str, tls: ServerTls, on_refused: Callable[[str], None],
    timeout: float,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """The connection's streams, or None once it is closed (no first
    bytes in time, plain on a TLS-only port, a failed handshake)."""
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + timeout
        head = await _peek(conn, deadline)
        if not head:
            conn.close()
            return None
        wrap = looks_like_tls(head)
        if not wrap and tls.mode == "required":
            on_refused(f"a plain (not TLS) connection from {where} on a TLS-only port")
            conn.close()
            return None
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        protocol = asyncio.StreamReaderProtocol(reader)
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol,
            conn,
            ssl=tls.context if wrap else None,
            ssl_handshake_timeout=max(deadline - loop.time(), 0.1) if wrap else None,
        )
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        on_refused(f"TLS handshake with {where} failed: {getattr(exc, 'reason', None) or exc}")
        with contextlib.suppress(OSError):
            conn.close()
        return None
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def serve_tls(
    accepted: Accepted, host: str, port: int, tls: ServerTls, on_refused: Callable[[str], None],
    *, admit: Callable[[str], str | None], release: Callable[[str], None],
    handshake_timeout: float | None = None, reuse_port: bool = False,
) -> TlsServer:
    """Listen on host:port and hand each connection, TLS-wrapped or (dual
    mode) plain, to ``accepted`` as asyncio streams.

    ``admit(source address)`` counts each connection as it is accepted
    (the listener's ``max_connections`` and per-address limits), before a
    byte is read: a refusal closes the socket at once, so a flood of
    connections that never handshake cannot hold more than the limit.
    ``accepted`` owns an admitted connection and releases it when it ends;
    one that ends sooner (no ClientHello, a failed handshake) is released
    here.  Sniffing the first bytes and the TLS handshake together get
    ``handshake_timeout`` (HANDSHAKE_TIMEOUT when None).  ``reuse_port``:
    bind with SO_REUSEPORT (workers share the port)."""
    loop = asyncio.get_running_loop()
    server_sock = socket.create_server(
        (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=511,
        reuse_port=reuse_port,
    )
    server_sock.setblocking(False)
    handlers: set[asyncio.Task[None]] = set()
    timeout = handshake_timeout or HANDSHAKE_TIMEOUT

    async def one(conn: socket.socket, where: str, source: str) -> None:
        try:
            streams = await _open_streams(conn, where, tls, on_refused, timeout)
        except BaseException:  # cancelled (the listener closes), or our bug
            release(source)
            with contextlib.suppress(OSError):
                conn.close()
            raise
        if streams is None:
            release(source)
            return
        # ``accepted`` owns the admission now and releases it at the end.
        await accepted(*streams, source)

    def refuse(conn: socket.socket, where: str, why: str) -> None:
        log.warning("%s: connection refused from %s: %s", tls.listener, where, why)
        with contextlib.suppress(OSError):
            conn.close()

    async def accept_loop() -> None:
        while True:
            try:
                conn, addr = await loop.sock_accept(server_sock)
            except OSError as exc:
                if server_sock.fileno() < 0:
                    return
                log.warning("%s: accept failed: %s", tls.listener, exc)
                await asyncio.sleep(0.1)
                continue
            where = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
            source = str(addr[0]) if isinstance(addr, tuple) else str(addr)
            refused = admit(source)
            if refused is not None:
                refuse(conn, where, refused)
                continue
            conn.setblocking(False)
            task = asyncio.create_task(one(conn, where, source))
            handlers.add(task)
            task.add_done_callback(handlers.discard)

    task = asyncio.create_task(accept_loop(), name=f"{tls.listener}-tls-accept")
    return TlsServer([server_sock], task, handlers)
