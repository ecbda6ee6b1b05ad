"""``polyport serve`` as an operator runs it: the ports file that
``polyport status`` reads, and SIGHUP reloading without stopping."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp

from tests.gateway.test_cli_errors import polyport
from tests.listeners import port_flags

ALL_PORTS_ZERO = port_flags("0")


async def _start(db_url: str, data_dir: Path, conf: Path) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    env["POLYPORT_DATABASE_URL"] = db_url  # a password: environment, never argv
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve",
        "--data-dir", str(data_dir), "--config", str(conf), *ALL_PORTS_ZERO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, "serve exited before listening"
        if "http listening on" in line:
            return proc


async def _stderr_until(proc: asyncio.subprocess.Process, needle: str) -> str:
    assert proc.stderr is not None
    seen = ""
    while needle not in seen:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert line, f"stderr closed before {needle!r}: {seen}"
        seen += line
    return seen


async def test_status_finds_a_gateway_on_port_zero_and_sighup_reloads(
    db_url: str, tmp_path: Path
) -> None:
    conf = tmp_path / "polyport.toml"
    conf.write_text('log_level = "info"\n')
    data_dir = tmp_path / "data"
    proc = await _start(db_url, data_dir, conf)
    try:
        ports = json.loads((data_dir / "gateway.json").read_text())
        assert ports["pid"] == proc.pid and ports["http"]["port"] > 0
        assert set(ports["listeners"]) >= {"bson", "res01", "segment"}

        done = await asyncio.to_thread(polyport, "status", "--json", "--database-url", db_url,
                                       "--data-dir", str(data_dir))
        assert done.returncode == 0, done.stderr
        gateway = json.loads(done.stdout)["gateway"]
        assert gateway["reachable"], gateway
        assert str(ports["http"]["port"]) in gateway["url"]

        conf.write_text('log_level = "debug"\nhost = "127.0.0.2"\n')
        proc.send_signal(signal.SIGHUP)
        said = await _stderr_until(proc, "reloaded configuration")
        assert "log_level info -> debug" in said
        assert "needs a restart: host" in said
        await asyncio.sleep(0.3)
        assert proc.returncode is None  # still serving

        # The admin token is reloadable, and never logged (issue 29 item 10).
        admin = f"http://127.0.0.1:{ports['http']['port']}/admin/connections"
        headers = {"Authorization": "Bearer reloaded-token-42"}
        async with aiohttp.ClientSession() as http, http.get(admin, headers=headers) as r:
            assert r.status == 404  # no token yet: the API is off
        conf.write_text('log_level = "debug"\nadmin_token = "reloaded-token-42"\n')
        conf.chmod(0o600)
        proc.send_signal(signal.SIGHUP)
        said = await _stderr_until(proc, "reloaded configuration")
        assert "admin_token changed" in said and "reloaded-token-42" not in said
        async with aiohttp.ClientSession() as http, http.get(admin, headers=headers) as r:
            assert r.status == 200, await r.text()

        conf.write_text('log_level = "loud"\n')
        proc.send_signal(signal.SIGHUP)
        said = await _stderr_until(proc, "reload refused")
        assert "log_level" in said and proc.returncode is None
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
    assert proc.returncode == 0
    assert not (data_dir / "gateway.json").exists()


async def test_sighup_reloads_the_certificate_of_a_running_serve(
    db_url: str, tmp_path: Path
) -> None:
    """A real SIGHUP to ``polyport serve``: certificate files replaced in
    place, an open TLS connection keeps working, a new one gets the new
    certificate."""
    from polyport.protocols.bson.client import BsonClient
    from tests.tlspki import make_pki, write_pair

    pki_dir = tmp_path / "pki"
    pki_dir.mkdir()
    pki = make_pki(pki_dir)
    conf = tmp_path / "polyport.toml"
    conf.write_text('log_level = "info"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    env["POLYPORT_DATABASE_URL"] = db_url  # a password: environment, never argv
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve",
        "--data-dir", str(tmp_path / "data"), "--config", str(conf), *ALL_PORTS_ZERO,
        "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    try:
        while "http listening on" not in (line := (
                await asyncio.wait_for(proc.stdout.readline(), 60)).decode()):
            assert line, "serve exited before listening"
        ports = json.loads((tmp_path / "data" / "gateway.json").read_text())
        host, port = ports["listeners"]["bson"]["host"], ports["listeners"]["bson"]["port"]

        async def served_cn() -> str:
            ctx = pki.client()
            _reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
            cert = writer.get_extra_info("peercert")
            writer.close()
            subject = dict(x[0] for x in cert["subject"]) if cert.get("subject") else {}
            return str(subject.get("commonName", ""))

        before = await served_cn()
        open_client = await BsonClient.connect(host, port, ssl=pki.client())
        await open_client.ping()

        write_pair(pki_dir, "server", pki.ca.issue_cert("127.0.0.1", "localhost",
                                                        common_name="reloaded-by-sighup"))
        proc.send_signal(signal.SIGHUP)
        await _stderr_until(proc, "reloaded TLS certificates")

        await open_client.ping()  # the open connection is untouched
        assert await served_cn() == "reloaded-by-sighup" != before
        await open_client.close()
        assert proc.returncode is None
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
    assert proc.returncode == 0
