"""The embedded PostgreSQL's files and accounts (issue 27.12): a private data
directory reached without opening its parents to everyone, a password file
that is never readable by others, a password on the unix socket too, and
its own system account; a cluster set up by an older version is brought to
the same state at its next start."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from polyport.gateway.process.embedded_pg import EmbeddedPostgres
from tests.conftest import remove_in_background

AS_ROOT = os.geteuid() == 0
ACCOUNT = "polyport"  # the cluster's own system account (docs/operations.md)


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory closed to other users, as /root is."""
    root = Path(tempfile.mkdtemp(prefix="polyport-test-home-", dir="/tmp"))
    root.chmod(0o755)
    home = root / "home"
    home.mkdir(mode=0o700)
    yield home
    remove_in_background(root)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _as(account: str, command: str) -> bool:
    """Whether ``command`` succeeds as ``account`` (its own group only)."""
    user = pwd.getpwnam(account)
    done = subprocess.run(["/bin/sh", "-c", command], check=False, user=user.pw_uid,
                          group=user.pw_gid, extra_groups=[], capture_output=True, cwd="/",
                          timeout=30)
    return done.returncode == 0


def _hba_methods(pg: EmbeddedPostgres) -> set[str]:
    lines = (pg.pgdata / "pg_hba.conf").read_text().splitlines()
    return {f.split()[-1] for f in (line.split("#", 1)[0] for line in lines) if f.strip()}


async def _socket_login(pg: EmbeddedPostgres, password: str | None) -> int:
    port = pg.running_port()
    assert port is not None
    conn = await asyncpg.connect(host=str(pg.run_dir), port=port, user="polyport",
                                 database="polyport", password=password)
    try:
        return int(await conn.fetchval("SELECT 1"))
    finally:
        await conn.close()


async def _check_secured(pg: EmbeddedPostgres, home: Path) -> None:
    # Nothing above or at the data directory opened to other users.
    assert _mode(home) & 0o007 == 0, oct(_mode(home))
    assert _mode(pg.data_dir) & 0o077 in (0, 0o010), oct(_mode(pg.data_dir))  # 010: ACL mask
    assert _mode(pg.password_file) == _mode(pg.log_file) == 0o600
    assert pg.password_file.is_file() and not pg.password_file.is_symlink()
    # A password on the unix socket too, as on TCP.
    assert _hba_methods(pg) == {"scram-sha-256"}
    with pytest.raises(asyncpg.InvalidPasswordError):
        await _socket_login(pg, None)
    assert await _socket_login(pg, pg.password) == 1
    if AS_ROOT:
        account = pwd.getpwnam(ACCOUNT)
        assert pg.pgdata.stat().st_uid == account.pw_uid  # not the shared postgres account
        assert (pg.run_dir.stat().st_uid, pg.log_file.stat().st_uid) == (account.pw_uid,) * 2
        # The account may pass through (search), not list; nobody else gains either.
        assert _as(ACCOUNT, f"cd {pg.data_dir}")
        assert not _as(ACCOUNT, f"ls {home}")
        assert not _as("nobody", f"cd {home}")


async def test_new_cluster_and_one_an_older_version_made(home: Path) -> None:
    pg = EmbeddedPostgres(home / "data", fast=True)
    try:
        await asyncio.to_thread(pg.start)
        await _check_secured(pg, home)
        conn = await asyncpg.connect(pg.url(pg.running_port() or 0))
        await conn.execute("CREATE TABLE kept AS SELECT 42 AS answer")
        await conn.close()
        await asyncio.to_thread(pg.stop)

        # What an older version left: trust on the socket, the shared
        # account owning the cluster, an open data directory.
        hba = pg.pgdata / "pg_hba.conf"
        hba.write_text(hba.read_text().replace(
            "local   all             all                                     scram-sha-256",
            "local   all             all                                     trust"))
        assert "trust" in _hba_methods(pg)
        if AS_ROOT:
            _give_to("postgres" if _exists("postgres") else "nobody",
                     pg.pgdata, pg.run_dir, pg.log_file)
        pg.data_dir.chmod(0o755)
        pg.log_file.chmod(0o644)

        again = EmbeddedPostgres(home / "data", fast=True)
        pg = again
        await asyncio.to_thread(again.start)
        await _check_secured(again, home)
        conn = await asyncpg.connect(again.url(again.running_port() or 0))
        assert await conn.fetchval("SELECT answer FROM kept") == 42
        await conn.close()
    finally:
        await asyncio.to_thread(pg.stop)


def _give_to(account: str, *paths: Path) -> None:
    user = pwd.getpwnam(account)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", *map(str, paths)],
                   check=True, timeout=60)


def _exists(account: str) -> bool:
    try:
        pwd.getpwnam(account)
    except KeyError:
        return False
    return True


async def test_password_file_is_never_written_through_a_link(home: Path) -> None:
    """Created with O_EXCL and 0600: a link left where the password file goes
    is replaced, and what it points to neither receives the password nor
    changes mode."""
    data = home / "data"
    data.mkdir(mode=0o700)
    decoy = home / "decoy"
    decoy.write_text("untouched\n")
    decoy.chmod(0o644)
    (data / "pg-password").symlink_to(decoy)
    pg = EmbeddedPostgres(data, fast=True)
    try:
        await asyncio.to_thread(pg.start)
        assert decoy.read_text() == "untouched\n" and _mode(decoy) == 0o644
        await _check_secured(pg, home)
    finally:
        await asyncio.to_thread(pg.stop)
