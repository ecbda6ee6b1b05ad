"""Defaults that gave away more than the operator asked for (issue 27.13):
``users add`` without a scope, a database password in argv, an admin token
in a configuration file other users can read.  The real ``polyport``
command, as a subprocess, on the test database."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.gateway.test_cli_errors import SECRET, assert_one_clean_line, polyport
from tests.listeners import port_flags


def _url_file(tmp_path: Path, url: str, mode: int = 0o600) -> Path:
    path = tmp_path / "database-url"
    path.write_text(url + "\n")
    path.chmod(mode)
    return path


async def _users(url_file: Path) -> dict[str, dict[str, object]]:
    done = await asyncio.to_thread(polyport, "users", "list", "--json", "--database-url-file",
                                   str(url_file))
    assert done.returncode == 0, done.stderr
    return {u["name"]: u for u in json.loads(done.stdout)}


async def test_users_add_needs_an_explicit_scope(db_url: str, tmp_path: Path) -> None:
    url_file = _url_file(tmp_path, db_url)
    add = ("users", "add", "--password-stdin", "--database-url-file", str(url_file))

    unscoped = await asyncio.to_thread(polyport, *add, "bob", stdin=f"{SECRET}\n")
    assert unscoped.returncode == 2, unscoped.stderr
    assert len(unscoped.stderr.strip().splitlines()) == 1, unscoped.stderr
    assert "--context" in unscoped.stderr and "--all-contexts" in unscoped.stderr
    assert "bob" not in await _users(url_file)  # nothing was granted

    both = await asyncio.to_thread(polyport, *add, "bob", "--context", "a", "--all-contexts",
                                   stdin=f"{SECRET}\n")
    assert both.returncode == 2 and "not allowed with" in both.stderr

    done = await asyncio.to_thread(polyport, *add, "bob", "--context", "a", stdin=f"{SECRET}\n")
    assert done.returncode == 0, done.stderr
    done = await asyncio.to_thread(polyport, *add, "root", "--all-contexts", stdin=f"{SECRET}\n")
    assert done.returncode == 0, done.stderr
    users = await _users(url_file)
    assert users["bob"]["contexts"] == ["a"]
    assert users["root"]["contexts"] is None  # every context, because it was asked for

    # Changing the default context alone must not widen bob to every context.
    contexts = ("users", "contexts", "bob", "--database-url-file", str(url_file))
    unscoped = await asyncio.to_thread(polyport, *contexts, "--default-context", "a")
    assert unscoped.returncode == 2 and "--all-contexts" in unscoped.stderr
    assert (await _users(url_file))["bob"]["contexts"] == ["a"]
    done = await asyncio.to_thread(polyport, *contexts, "--context", "a", "--context", "b")
    assert done.returncode == 0, done.stderr
    assert (await _users(url_file))["bob"]["contexts"] == ["a", "b"]


async def test_database_password_in_argv_is_warned_about(db_url: str, tmp_path: Path) -> None:
    in_argv = await asyncio.to_thread(polyport, "users", "list", "--json", "--database-url", db_url)
    assert in_argv.returncode == 0, in_argv.stderr
    [warning] = [line for line in in_argv.stderr.splitlines() if "WARNING" in line]
    assert "--database-url-file" in warning and "POLYPORT_DATABASE_URL" in warning
    password = db_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    assert password not in in_argv.stderr

    # From a private file or the environment: the same command, no warning.
    from_file = await asyncio.to_thread(polyport, "users", "list", "--json", "--database-url-file",
                                        str(_url_file(tmp_path, db_url)))
    from_env = await asyncio.to_thread(polyport, "users", "list", "--json",
                                       env={"POLYPORT_DATABASE_URL": db_url})
    for done in (from_file, from_env):
        assert done.returncode == 0, done.stderr
        assert "WARNING" not in done.stderr and json.loads(done.stdout) == []

    # A password file that others can read is refused like a TLS key.
    loose = await asyncio.to_thread(polyport, "users", "list", "--json", "--database-url-file",
                                    str(_url_file(tmp_path, db_url, 0o644)))
    err = assert_one_clean_line(loose, "--database-url-file", "chmod 600")
    assert password not in err
    both = await asyncio.to_thread(polyport, "users", "list", "--json", "--database-url", db_url,
                                   "--database-url-file", str(_url_file(tmp_path, db_url)))
    assert_one_clean_line(both, "--database-url-file")


async def test_admin_token_in_a_readable_config_file_is_refused(
    db_url: str, tmp_path: Path
) -> None:
    conf = tmp_path / "polyport.toml"
    conf.write_text(f'admin_token = "{SECRET}"\n')
    conf.chmod(0o644)
    env = {"POLYPORT_DATABASE_URL": db_url}
    serve = ("serve", "--config", str(conf), "--data-dir", str(tmp_path / "data"),
             *port_flags("off", but=("http",)), "--http-port", "0")
    refused = await asyncio.to_thread(polyport, *serve, env=env)
    err = assert_one_clean_line(refused, "admin_token", str(conf), "chmod 600",
                                "POLYPORT_ADMIN_TOKEN")
    assert "0644" in err
    # Every command reads the same file: none of them runs with it.
    listed = await asyncio.to_thread(polyport, "users", "list", "--config", str(conf), env=env)
    assert_one_clean_line(listed, "admin_token", "chmod 600")

    conf.chmod(0o600)
    listed = await asyncio.to_thread(polyport, "users", "list", "--config", str(conf), env=env)
    assert listed.returncode == 0, listed.stderr
    # A file without a secret may stay readable.
    conf.write_text('log_level = "info"\n')
    conf.chmod(0o644)
    listed = await asyncio.to_thread(polyport, "users", "list", "--config", str(conf), env=env)
    assert listed.returncode == 0, listed.stderr
