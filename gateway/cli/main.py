"""polyport: one event store, reached in six native wire protocols.

Run ``polyport COMMAND --help`` for a command's options.  Options that find
the database and set up logging (``--config``, ``--database-url``,
``--data-dir``, ``--log-format``, ``--log-level``, ``--debug``) are accepted
before or after the command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import traceback
from urllib.parse import urlsplit

from polyport.gateway.cli.commands import (
    CommandError,
    _binders,
    _keys,
    _subscriptions,
    _users,
    _with_store,
    read_password,
)
from polyport.gateway.cli.connections_cli import AdminError, run_connections
from polyport.gateway.cli.migrate_cli import _migrate
from polyport.gateway.cli.parser import build_parser
from polyport.gateway.cli.status_cli import run_status
from polyport.gateway.config import ConfigError, GatewayConfig, config_from_args
from polyport.gateway.process.data_dir import DataDirLock
from polyport.gateway.process.eventloop import choose_loop
from polyport.gateway.process.eventloop import run as run_on_loop
from polyport.gateway.process.fatal import _say_fatal, describe
from polyport.gateway.process.logging_setup import setup_logging
from polyport.gateway.process.scheduling import apply_policy
from polyport.gateway.process.serve import _serve
from polyport.pipeline.cli import run as run_pipeline

log = logging.getLogger("polyport")


def _password_in_argv(args: argparse.Namespace) -> bool:
    """--database-url's value carries a password: every user of the machine
    can read it in the process list."""
    url = getattr(args, "database_url", None)
    try:
        return bool(url and urlsplit(url).password)
    except ValueError:  # not a URL: load_config has said so
        return False


def _raw_setting(args: argparse.Namespace, key: str, default: str) -> str:
    """A logging setting before the configuration is known to be valid."""
    value = getattr(args, key, None) or os.environ.get(f"POLYPORT_{key.upper()}") or default
    return str(value).lower()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config: GatewayConfig | None = None
    try:
        config = config_from_args(args)
        setup_logging(config.log_format, config.log_level)
        if _password_in_argv(args):
            log.warning("--database-url carries a password that every user of this machine "
                        "can read in the process list: use --database-url-file FILE or "
                        "POLYPORT_DATABASE_URL instead")
        if args.command == "serve":
            # Held until this process (the supervisor, with workers) exits.
            with DataDirLock(config.data_dir):
                if config.workers > 1:
                    from polyport.gateway.process.supervisor import supervise

                    return supervise(config, args)
                apply_policy(config.cpu_scheduling)
                choice = choose_loop(config.event_loop)
                return run_on_loop(_serve(config, args, choice), choice)
        if args.command == "migrate":
            return _migrate(args, config)
        if args.command == "status":
            return asyncio.run(run_status(
                args, config, lambda fn: _with_store(config, fn, start_database=False)))
        if args.command == "pipeline":
            return run_pipeline(args, config)
        if args.command == "connections":
            return asyncio.run(run_connections(args, config))
        if args.command == "users" and args.action in ("add", "passwd"):
            args.new_password = read_password(args)  # before any database work
        handler = {"users": _users, "keys": _keys, "binders": _binders,
                   "subscriptions": _subscriptions}[
            args.command
        ]
        return asyncio.run(_with_store(config, lambda s: handler(args, s)))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`polyport migrate --sql | head`): not an error
        # of ours.  Point stdout at /dev/null so the interpreter's final flush
        # does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - the last resort: said, and an exit status
        level = config.log_level if config else _raw_setting(args, "log_level", "info")
        fmt = config.log_format if config else _raw_setting(args, "log_format", "text")
        if getattr(args, "debug", False) or level == "debug":
            traceback.print_exc()
        message = str(exc) if isinstance(exc, CommandError | AdminError) else describe(
            exc, config.database_url if config else None)
        _say_fatal(message, fmt)
        # A bad value given as a flag is a usage error (2), as argparse's are;
        # the configuration's errors name their source, flags start with "--".
        return 2 if isinstance(exc, ConfigError) and str(exc).startswith("--") else 1


if __name__ == "__main__":
    sys.exit(main())
