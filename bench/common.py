"""Shared benchmark plumbing: a durable throwaway cluster, raw-PostgreSQL
baselines measured in the same run, progress lines and the result table.

Baselines write into the real ``events`` table (same indexes) of a separate
database on the same cluster, so ratios compare like with like.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from polyport.core import migrate, sql
from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from polyport.gateway.process.ports_file import read_ports_file

_db_counter = itertools.count()


class Progress:
    """One self-overwriting line on stderr while a phase runs."""

    def __init__(self, label: str, total: int | None = None) -> None:
        self.label = label
        self.total = total
        self.started = time.monotonic()
        self._last = 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        of = f"/{self.total}" if self.total else ""
        rate = done / max(now - self.started, 1e-9)
        sys.stderr.write(f"\r  {self.label}: {done}{of} ({rate:,.0f}/s)   ")
        sys.stderr.flush()

    def done(self, count: int) -> None:
        self.update(count, force=True)
        sys.stderr.write("\n")


@asynccontextmanager
async def bench_cluster() -> AsyncIterator[EmbeddedPostgres]:
    """A fresh cluster with production durability (fsync on), removed after."""
    root = Path(tempfile.mkdtemp(prefix="polyport-bench-", dir="/tmp"))
    root.chmod(0o755)  # once, before any I/O runs
    pg = EmbeddedPostgres(root / "data", fast=False)
    sys.stderr.write("starting a throwaway PostgreSQL cluster (fsync on)...\n")
    await asyncio.get_running_loop().run_in_executor(None, pg.start)
    try:
        yield pg
    finally:
        await asyncio.get_running_loop().run_in_executor(None, pg.stop)
        shutil.rmtree(root, ignore_errors=True)


async def fresh_database(pg: EmbeddedPostgres) -> str:
    """A new migrated database on the cluster; returns its URL."""
    url = await empty_database(pg)
    await asyncio.get_running_loop().run_in_executor(None, migrate.upgrade, url, "head")
    return url


async def empty_database(pg: EmbeddedPostgres) -> str:
    """A new database on the cluster with no schema yet; returns its URL."""
    port = pg.running_port()
    assert port is not None
    admin = pg.url(port)
    name = f"bench_{os.getpid()}_{next(_db_counter)}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return admin.rsplit("/", 1)[0] + "/" + name


class BenchError(Exception):
    """A failure worth one line, not a traceback."""


def say(line: str) -> None:
    """A progress line, on stderr (the tables go to stdout)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# --- another install beside this tree (--baseline) ------------------------------------


BASELINE_HELP = ("another install's polyport command (e.g. a checkout of an earlier commit, "
                 "its virtualenv's bin/polyport): measured beside this tree, on its own "
                 "database, alternating")


def baseline_command(text: str) -> list[str]:
    """The words of a ``--baseline`` command (empty: none); BenchError
    when its program is not an executable command."""
    words = shlex.split(text)
    if words and shutil.which(words[0]) is None:
        raise BenchError(f"--baseline: {words[0]} is not an executable command")
    return words


async def baseline_database(pg: EmbeddedPostgres, command: Sequence[str]) -> str:
    """A new database migrated by the baseline's own ``migrate``; its URL."""
    url = await empty_database(pg)
    proc = await asyncio.create_subprocess_exec(
        *command, "migrate", "upgrade", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        # The URL carries a password: environment, never argv.
        env={**os.environ, "POLYPORT_DATABASE_URL": url, "POLYPORT_LOG_LEVEL": "warning"})
    _out, err = await proc.communicate()
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise BenchError(f"--baseline: its migrate upgrade failed ({last}); check that "
                         f"{command[0]} is a polyport command")
    say(f"baseline: {' '.join(command)}, on its own database")
    return url


_INSERT_ONE = f"""
INSERT INTO events ({", ".join(sql.EVENT_COLUMNS)})
VALUES (nextval('bench_position'), $1, 'bench', $2, $3, 'bench', '{{}}'::jsonb, $4,
        'application/octet-stream', NULL, now(), 'raw', 0)
"""


async def _prepare_raw(url: str) -> None:
    conn = await asyncpg.connect(migrate.asyncpg_dsn(url))
    try:
        await conn.execute("CREATE SEQUENCE IF NOT EXISTS bench_position")
    finally:
        await conn.close()


async def raw_single_row_rate(url: str, clients: int, seconds: float, body: bytes) -> float:
    """Rows/s of ``clients`` connections each inserting one row per transaction."""
    await _prepare_raw(url)
    dsn = migrate.asyncpg_dsn(url)
    # Connected (and the statement prepared) before the clock starts, as the
    # core's store is: only the inserts are timed.
    conns = await asyncio.gather(*(asyncpg.connect(dsn) for _ in range(clients)))
    try:
        for conn in conns:
            await conn.prepare(_INSERT_ONE)
        counts = [0] * clients
        versions = [0] * clients
        prog = Progress(f"raw asyncpg, {clients} clients, 1 row/tx")
        deadline = time.monotonic() + seconds

        async def client(i: int) -> None:
            conn = conns[i]
            stream = f"raw-{i}-{uuid.uuid4().hex[:8]}"
            while time.monotonic() < deadline:
                versions[i] += 1
                await conn.execute(_INSERT_ONE, uuid.uuid4(), stream, versions[i], body)
                counts[i] += 1
                prog.update(sum(counts))

        started = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.monotonic() - started
    finally:
        await asyncio.gather(*(conn.close() for conn in conns))
    prog.done(sum(counts))
    return sum(counts) / elapsed


async def raw_copy_rate(url: str, rows: int, body: bytes, batch: int = 10_000) -> float:
    """Rows/s of binary COPY into the events table."""
    await _prepare_raw(url)
    conn = await asyncpg.connect(migrate.asyncpg_dsn(url))
    prog = Progress("raw binary COPY", rows)
    try:
        base = await conn.fetchval("SELECT coalesce(max(position), 0) FROM events") + 10_000_000
        now = datetime.now(UTC)
        stream = f"copy-{uuid.uuid4().hex[:6]}"
        started = time.monotonic()
        done = 0
        while done < rows:
            n = min(batch, rows - done)
            records = [
                (base + done + i, uuid.uuid4(), "bench", stream, done + i + 1, "bench",
                 "{}", body, "application/octet-stream", None, now, "raw", 0)
                for i in range(n)
            ]
            await conn.copy_records_to_table("events", records=records, columns=sql.EVENT_COLUMNS)
            done += n
            prog.update(done)
        elapsed = time.monotonic() - started
    finally:
        await conn.close()
    prog.done(rows)
    return rows / elapsed


async def timed_rate(
    label: str, workers: int, seconds: float, op: Callable[[int], Awaitable[int]]
) -> float:
    """Run ``op(worker)`` in ``workers`` loops for ``seconds``; ``op`` returns
    how many items it completed.  Returns items/s."""
    deadline = time.monotonic() + seconds
    counts = [0] * workers
    prog = Progress(label)

    async def loop(i: int) -> None:
        while time.monotonic() < deadline:
            counts[i] += await op(i)
            prog.update(sum(counts))

    started = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(workers)))
    elapsed = time.monotonic() - started
    prog.done(sum(counts))
    return sum(counts) / elapsed


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1]."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(title: str, rows: list[tuple[str, float, str]]) -> None:
    """Print the result table: (measurement, value, unit)."""
    print(f"\n{title}")
    width = max(len(r[0]) for r in rows)
    for name, value, unit in rows:
        print(f"  {name:<{width}}  {value:>12,.2f} {unit}")
    if os.environ.get("POLYPORT_BENCH_JSON"):
        print(json.dumps({name: value for name, value, _ in rows}))


async def stop_process(proc: asyncio.subprocess.Process | None, grace: float = 30) -> None:
    """SIGTERM (a gateway drains), then SIGKILL after ``grace`` seconds."""
    if proc is None or proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        proc.kill()
        await proc.wait()


class ServeFailed(RuntimeError):
    """``polyport serve`` exited, or did not listen in time."""


async def wait_listening(
    proc: asyncio.subprocess.Process, data_dir: Path, timeout: float = 120
) -> dict[str, tuple[str, int]]:
    """The listeners of ``polyport serve`` (name -> host, port) once the
    gateway.json in ``data_dir`` names ``proc``: an older file from an earlier
    process on that directory is not taken for it."""
    started = time.monotonic()
    while True:
        data = read_ports_file(str(data_dir))
        if data is not None and data.get("pid") == proc.pid:
            return {n: (li["host"], int(li["port"])) for n, li in data["listeners"].items()}
        if proc.returncode is not None:
            raise ServeFailed(f"polyport serve exited with code {proc.returncode} "
                              "before listening (its error is above)")
        if time.monotonic() - started > timeout:
            raise ServeFailed(f"polyport serve did not listen within {timeout:.0f} s")
        await asyncio.sleep(0.05)
