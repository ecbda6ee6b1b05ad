"""Issue 29 item 10: the systemd unit and example configuration in
docs/examples/ are real, ``serve`` tells a service manager READY=1 (and
STOPPING=1) over a real ``$NOTIFY_SOCKET``, prints each listener once and one
``ready`` line, and with JSON logs writes every line as JSON on one stream."""

from __future__ import annotations

import asyncio
import configparser
import json
import os
import shlex
import signal
import socket
import sys
from pathlib import Path

import pytest

from polyport.gateway.cli.parser import build_parser
from polyport.gateway.config import load_config
from tests.listeners import port_flags

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
pytestmark = pytest.mark.timeout(120)


def test_the_example_configuration_loads() -> None:
    config = load_config(str(EXAMPLES / "polyport.toml"), env={})
    assert config.data_dir == "/var/lib/polyport" and config.log_format == "json"
    assert config.workers >= 1 and config.allow_anonymous is False


def test_the_unit_waits_for_readiness_and_runs_a_real_command() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(EXAMPLES / "polyport.service")
    service = unit["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/polyport")
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve" and args.config == "/etc/polyport/polyport.toml"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"


async def _serve(db_url: str, notify: Path | None, *extra: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    env["POLYPORT_DATABASE_URL"] = db_url
    if notify is not None:
        env["NOTIFY_SOCKET"] = str(notify)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve", *port_flags("0"), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)


async def test_ready_and_stopping_reach_the_notify_socket(db_url: str, tmp_path: Path) -> None:
    path = Path("/tmp") / f"pp-notify-{os.getpid()}-{id(tmp_path)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    proc = await _serve(db_url, path, "--data-dir", str(tmp_path / "data"))
    try:
        ready = (await asyncio.wait_for(loop.sock_recv(sock, 4096), 60)).decode()
        fields = dict(line.split("=", 1) for line in ready.splitlines())
        assert fields["READY"] == "1" and fields["MAINPID"] == str(proc.pid)
        assert fields["STATUS"].startswith("ready: status page http://127.0.0.1:")
        assert "admin API off" in fields["STATUS"]
        proc.send_signal(signal.SIGTERM)
        assert (await asyncio.wait_for(loop.sock_recv(sock, 4096), 30)) == b"STOPPING=1"
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        sock.close()
        path.unlink(missing_ok=True)
    lines = out.decode().splitlines()
    names = [line.split()[1] for line in lines if " listening on " in line]
    assert len(names) == len(set(names)) == 7  # six protocols and http, once each
    assert lines[-1].startswith("polyport: ready: status page http://127.0.0.1:")
    assert " listener " not in err.decode()  # not a second time in the log


async def test_json_logs_are_one_stream(db_url: str, tmp_path: Path) -> None:
    proc = await _serve(db_url, None, "--data-dir", str(tmp_path / "data"),
                        "--log-format", "json")
    assert proc.stderr is not None
    seen: list[dict[str, object]] = []
    try:
        while not any(str(r.get("message", "")).startswith("ready:") for r in seen):
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, "serve exited before it was ready"
            seen.append(json.loads(line))  # every line is JSON
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert out == b""  # nothing on stdout: one stream
    for line in err.decode().splitlines():
        json.loads(line)
    assert sum(" listening on " in str(r["message"]) for r in seen) == 7
