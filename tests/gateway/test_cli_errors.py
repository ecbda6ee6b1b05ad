"""Fatal errors of the ``polyport`` command: one line that names what failed
and what to change, no traceback, no password, non-zero exit."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.listeners import port_flags

SECRET = "s3cr3t-pw"
LISTENERS_OFF = port_flags("off", but=("http",))


def polyport(*args: str, env: dict[str, str] | None = None,
             stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # The test process's own settings stay out, but for its data directory
    # (tests/conftest.py): never the machine's default one.
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("POLYPORT_") or k == "POLYPORT_DATA_DIR"}
    return subprocess.run([sys.executable, "-m", "polyport.gateway.cli.main", *args],
                          check=False, capture_output=True, text=True, timeout=120, input=stdin,
                          env={**base, **(env or {})})


def assert_one_clean_line(done: subprocess.CompletedProcess[str], *names: str) -> str:
    err = done.stderr.strip()
    assert done.returncode not in (0, None), (done.returncode, err)
    assert "Traceback" not in err, err
    assert SECRET not in err + done.stdout, err
    assert 1 <= len(err.splitlines()) <= 2, err
    for name in names:
        assert name in err, (name, err)
    return err


def with_user(url: str, user: str, password: str = SECRET) -> str:
    scheme, rest = url.split("://", 1)
    hostpart = rest.split("@", 1)[-1]
    return f"{scheme}://{user}:{password}@{hostpart}"


def test_unreachable_database() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"postgresql://polyport:{SECRET}@127.0.0.1:{port}/polyport"
    for command in (["serve", "--http-port", "0", *LISTENERS_OFF], ["migrate"]):
        # A password: the environment, never argv (argv would add a warning line).
        done = polyport(*command, env={"POLYPORT_DATABASE_URL": url})
        err = assert_one_clean_line(done, "--database-url")
        assert "cannot reach PostgreSQL" in err and "***" in err


async def test_missing_role(admin_url: str) -> None:
    url = with_user(admin_url, "no_such_role_here")
    done = await asyncio.to_thread(polyport, "migrate", "current", "--database-url", url)
    err = assert_one_clean_line(done, "--database-url")
    assert "no_such_role_here" in err


def test_url_scheme_typo_is_named_without_the_password() -> None:
    url = f"postgressql://polyport:{SECRET}@127.0.0.1/polyport"
    for where in (["--database-url", url], []):
        env = {} if where else {"POLYPORT_DATABASE_URL": url}
        err = assert_one_clean_line(polyport("users", "list", *where, env=env),
                                    "--database-url" if where else "POLYPORT_DATABASE_URL")
        assert "postgressql" in err


async def test_port_in_use_names_the_listener_and_flag(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--http-port", "0", *LISTENERS_OFF, "--bson-port", str(port)]
        done = await asyncio.to_thread(polyport, *args, env={"POLYPORT_DATABASE_URL": db_url})
    err = assert_one_clean_line(done, "--bson-port", "bson", str(port))
    assert "address already in use" in err


async def test_res01_port_in_use_names_the_flag(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        off = [*LISTENERS_OFF, "--res01-port", str(port)]  # the last flag wins
        done = await asyncio.to_thread(polyport, "serve", "--http-port", "0", *off,
                                       env={"POLYPORT_DATABASE_URL": db_url})
    err = assert_one_clean_line(done, "--res01-port", "res01", str(port))
    assert "address already in use" in err


def test_bad_log_level_from_flag_file_and_env(tmp_path: Path) -> None:
    assert_one_clean_line(polyport("--log-level", "verbose", "migrate", "current"), "--log-level")
    conf = tmp_path / "polyport.toml"
    conf.write_text('log_level = "verbose"\n')
    assert_one_clean_line(polyport("migrate", "current", "--config", str(conf)), "log_level")
    conf.write_text('log_format = "yaml"\n')
    assert_one_clean_line(polyport("migrate", "current", "--config", str(conf)), "log_format")
    assert_one_clean_line(polyport("migrate", "current", env={"POLYPORT_LOG_LEVEL": "loud"}),
                          "POLYPORT_LOG_LEVEL")


def test_bad_environment_value_names_the_variable() -> None:
    err = assert_one_clean_line(polyport("serve", env={"POLYPORT_HTTP_PORT": "eighty"}),
                                "POLYPORT_HTTP_PORT")
    assert "eighty" in err


def test_json_log_format_applies_to_fatal_errors() -> None:
    url = f"postgressql://polyport:{SECRET}@127.0.0.1/polyport"
    done = polyport("--log-format", "json", "users", "list", "--database-url", url)
    err = assert_one_clean_line(done, "--database-url")
    line = json.loads(err)
    assert line["level"] == "error" and "--database-url" in line["message"]


def test_debug_shows_the_traceback() -> None:
    url = f"postgresql://polyport:{SECRET}@127.0.0.1:1/polyport"
    done = polyport("migrate", "current", "--database-url", url, "--debug")
    assert done.returncode == 1 and "Traceback" in done.stderr


def test_common_options_after_the_subcommand_and_version() -> None:
    version = polyport("--version")
    assert version.returncode == 0 and version.stdout.startswith("polyport ")
    for args in (["users", "list", "--database-url", "x://"],
                 ["--database-url", "x://", "users", "list"]):
        assert_one_clean_line(polyport(*args), "--database-url")


@pytest.mark.parametrize("command", [["users", "add", "bob", "--all-contexts"],
                                     ["users", "passwd", "bob"]])
def test_password_never_on_the_command_line(command: list[str]) -> None:
    rejected = polyport(*command, "--password", SECRET)
    assert rejected.returncode == 2 and "--password" in rejected.stderr
    # Without a terminal and without --password-stdin there is nobody to ask.
    done = polyport(*command, "--database-url", "postgresql://u@127.0.0.1:1/x", stdin="")
    assert_one_clean_line(done, "--password-stdin")


async def test_password_from_stdin_logs_in(db_url: str) -> None:
    from polyport.core.store import EventStore, StoreConfig

    done = await asyncio.to_thread(polyport, "users", "add", "carol", "--password-stdin",
                                   "--all-contexts", "--database-url", db_url,
                                   stdin=f"{SECRET}\n")
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    store = EventStore(StoreConfig(db_url, pool_min=1, pool_max=2, run_binders=False))
    await store.start()
    try:
        assert (await store.users.authenticate("carol", SECRET)).user == "carol"
    finally:
        await store.close()


async def test_alembic_is_quiet_by_default(empty_db_url: str) -> None:
    done = await asyncio.to_thread(polyport, "migrate", "--database-url", empty_db_url)
    assert done.returncode == 0, done.stderr
    assert "Context impl" not in done.stderr + done.stdout
    assert done.stdout.startswith("schema at ")


def test_anonymous_contexts_from_environment_and_toml(tmp_path: Path) -> None:
    from polyport.gateway.config import ConfigError, load_config

    assert load_config(env={}).anonymous_contexts == ("default",)
    env = {"POLYPORT_ANONYMOUS_CONTEXTS": " public, default,public"}
    assert load_config(env=env).anonymous_contexts == ("public", "default")
    conf = tmp_path / "polyport.toml"
    conf.write_text('anonymous_contexts = ["open", "default"]\n')
    assert load_config(str(conf), env={}).anonymous_contexts == ("open", "default")
    for bad in ('anonymous_contexts = []\n', "anonymous_contexts = 3\n"):
        conf.write_text(bad)
        with pytest.raises(ConfigError, match="anonymous_contexts"):
            load_config(str(conf), env={})


def test_usage_errors_exit_2_in_one_line() -> None:
    """Issue 29 item 8: a bad flag value is a usage error (2), as argparse's are."""
    for args, names in (
        (("serve", "--http-port", "abc"), ("--http-port", "abc")),
        (("subscriptions", "create", "x", "--context", "a", "--start", "yesterday"),
         ("--start", "yesterday")),
        (("subscriptions", "reset", "x", "--time", "last week"), ("--time", "ISO 8601")),
    ):
        done = polyport(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert_one_clean_line(done, *names)


@pytest.mark.parametrize(("variable", "value"), [
    ("POLYPORT_MAX_EVENT_BYTES", "-5"), ("POLYPORT_POLL_INTERVAL", "0"),
    ("POLYPORT_IDLE_TIMEOUT", "nan"), ("POLYPORT_MAX_CONNECTIONS", "-1"),
])
def test_numbers_out_of_range_stop_the_start(variable: str, value: str) -> None:
    done = polyport("serve", "--database-url", "postgresql://u@127.0.0.1:1/x",
                    env={variable: value})
    line = assert_one_clean_line(done, variable, repr(value))
    assert "cannot reach" not in line  # refused before any connection was tried


def test_a_closed_pipe_is_not_an_error() -> None:
    """``polyport migrate --sql | head -1``: the reader leaving is not a failure."""

    proc = subprocess.Popen([sys.executable, "-m", "polyport.gateway.cli.main", "migrate", "--sql"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0, err
    assert "BrokenPipe" not in err and "error" not in err, err


async def test_a_default_context_outside_the_users_contexts_is_refused(db_url: str) -> None:
    done = await asyncio.to_thread(
        polyport, "users", "add", "carol", "--password-stdin", "--context", "a",
        "--default-context", "b", "--database-url", db_url, stdin=f"{SECRET}\n")
    assert_one_clean_line(done, "default context 'b'", "--context b")
    # Without --default-context the user's first context is the default.
    done = await asyncio.to_thread(
        polyport, "users", "add", "dave", "--password-stdin", "--context", "a",
        "--database-url", db_url, stdin=f"{SECRET}\n")
    assert done.returncode == 0, done.stderr
    listed = await asyncio.to_thread(polyport, "users", "list", "--json",
                                     "--database-url", db_url)
    assert [(u["name"], u["default_context"]) for u in json.loads(listed.stdout)] == [
        ("dave", "a")]
