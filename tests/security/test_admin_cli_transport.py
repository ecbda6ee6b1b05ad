"""``polyport connections`` carries the admin token: over HTTPS, checked
against the certificate the configuration names, when the HTTP port speaks
TLS; never in plain HTTP to a host that is not this machine (issue 27.10).
The gateway and the command both run as real processes."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

import pytest

from tests.gateway.test_cli_errors import SECRET, assert_one_clean_line, polyport
from tests.gateway.test_serve_process import _start
from tests.tlspki import make_pki, write_pair


def _config(path: Path, cert: Path, key: Path) -> Path:
    path.write_text(f'tls_cert = "{cert}"\ntls_key = "{key}"\nadmin_token = "{SECRET}"\n')
    path.chmod(0o600)  # it holds the token
    return path


async def test_connections_goes_over_https_to_the_configured_certificate(
    db_url: str, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    conf = _config(tmp_path / "polyport.toml", pki.cert, pki.key)
    data_dir = tmp_path / "data"
    proc = await _start(db_url, data_dir, conf)
    try:
        def connections(config: Path, *extra: str) -> tuple[int, str, str]:
            done = polyport("connections", "list", "--config", str(config),
                            "--data-dir", str(data_dir), *extra)
            return done.returncode, done.stdout, done.stderr

        status, out, err = await asyncio.to_thread(connections, conf)
        assert status == 0, err
        assert out.startswith(("ID", "no open connections")), out

        # A CA bundle instead of the pin: the gateway's name is checked too.
        status, out, err = await asyncio.to_thread(connections, conf, "--ca-file",
                                                   str(pki.ca_file))
        assert status == 0, err

        # A configuration naming another certificate, even one the same CA
        # signed, does not trust this gateway: the token is not sent.
        other_cert, other_key = write_pair(tmp_path, "other",
                                           pki.ca.issue_cert("127.0.0.1", "localhost"))
        other = _config(tmp_path / "other.toml", other_cert, other_key)
        done = await asyncio.to_thread(polyport, "connections", "list", "--config", str(other),
                                       "--data-dir", str(data_dir))
        assert_one_clean_line(done, "TLS check", "--ca-file")
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)


def _non_loopback_address() -> str:
    """An address of this machine that is not loopback (the one a packet to
    a documentation network would leave from); none: skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # UDP: no packet is sent
        except OSError:
            pytest.skip("this machine has no non-loopback IPv4 address")
        address: str = s.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


async def test_no_admin_token_in_plain_http_to_another_host(tmp_path: Path) -> None:
    address = _non_loopback_address()
    received: list[bytes] = []

    async def listener(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        writer.close()

    server = await asyncio.start_server(listener, address, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        done = await asyncio.to_thread(
            polyport, "connections", "list", "--host", address, "--http-port", str(port),
            "--data-dir", str(tmp_path / "data"), env={"POLYPORT_ADMIN_TOKEN": SECRET})
    finally:
        server.close()
        await server.wait_closed()
    err = assert_one_clean_line(done, "plain HTTP", address, "TLS", "127.0.0.1")
    assert "Traceback" not in err
    assert received == []  # not even a connection: the token never left
