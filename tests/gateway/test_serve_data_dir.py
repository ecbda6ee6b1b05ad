"""One ``polyport serve`` per data directory (issue 29.3): a second one is
refused with the holder's pid and leaves the first one's ``gateway.json``
alone; the lock goes with the process, however it ends."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp

from tests.gateway.test_serve_process import ALL_PORTS_ZERO, _start


async def _healthy(ports: dict[str, object]) -> bool:
    http = ports["http"]
    assert isinstance(http, dict)
    async with aiohttp.ClientSession() as s, s.get(
        f"http://{http['host']}:{http['port']}/healthz", timeout=aiohttp.ClientTimeout(10)
    ) as r:
        return r.status == 200


async def _second_serve(db_url: str, data_dir: Path, conf: Path) -> tuple[int, str]:
    """Run another serve on ``data_dir``: (exit status, stderr).  If it gets
    as far as listening, it was let in: stop it and say so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    env["POLYPORT_DATABASE_URL"] = db_url
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve",
        "--data-dir", str(data_dir), "--config", str(conf), *ALL_PORTS_ZERO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        while line := (await asyncio.wait_for(proc.stdout.readline(), 60)).decode():
            assert "listening on" not in line, "a second serve started on the same data dir"
        await asyncio.wait_for(proc.wait(), 60)
        return proc.returncode or 0, (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 60)


async def test_second_serve_on_a_data_dir_is_refused(db_url: str, tmp_path: Path) -> None:
    conf = tmp_path / "polyport.toml"
    conf.write_text('log_level = "info"\n')
    data_dir = tmp_path / "data"
    first = await _start(db_url, data_dir, conf)
    try:
        ports_file = data_dir / "gateway.json"
        ports = json.loads(ports_file.read_text())
        assert ports["pid"] == first.pid

        status, err = await _second_serve(db_url, data_dir, conf)
        assert status != 0
        [line] = err.strip().splitlines()
        assert line.startswith("polyport: ") and "Traceback" not in err
        assert f"pid {first.pid}" in line and "--data-dir" in line
        # The first gateway is still the one the ports file names, and serving.
        assert json.loads(ports_file.read_text()) == ports
        assert await _healthy(ports)
    finally:
        first.kill()  # a crash: the kernel drops the lock with the process
        await asyncio.wait_for(first.wait(), 60)

    # The file the dead gateway left names a dead pid; the next serve may start.
    again = await _start(db_url, data_dir, conf)
    try:
        assert json.loads((data_dir / "gateway.json").read_text())["pid"] == again.pid
    finally:
        again.send_signal(signal.SIGTERM)
        await asyncio.wait_for(again.wait(), 60)
    assert again.returncode == 0
    assert not (data_dir / "gateway.json").exists()
