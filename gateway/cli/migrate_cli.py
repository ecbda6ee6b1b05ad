"""``polyport migrate``: upgrade, downgrade, stamp or inspect the schema, or
print the SQL of a migration offline; a downgrade under a serving gateway is
refused and asked about first."""

from __future__ import annotations

import argparse
import asyncio
import sys

from polyport.core import migrate
from polyport.gateway.cli.commands import CommandError
from polyport.gateway.config import GatewayConfig
from polyport.gateway.process.database import database_url


def _migrate(args: argparse.Namespace, config: GatewayConfig) -> int:
    rev = args.revision
    if args.action in ("downgrade", "stamp") and not rev:
        raise CommandError(f"migrate {args.action} needs a target revision (e.g. 'base' or "
                           f"'{migrate.head_revision()}'); 'polyport migrate history' lists them")
    if args.sql:
        if args.action not in ("upgrade", "downgrade"):
            raise CommandError("--sql goes with upgrade or downgrade")
        # Offline: Alembic writes the script; no database is contacted.
        url = config.database_url or "postgresql://offline/polyport"
        if args.action == "upgrade":
            migrate.upgrade(url, rev or "head", sql=True)
        else:
            if ":" not in rev:
                raise CommandError("offline downgrade needs FROM:TO, e.g. "
                                   f"'{migrate.head_revision()}:base'")
            migrate.downgrade(url, rev, sql=True)
        return 0
    with database_url(config, say=False) as (url, _embedded):
        if args.action == "upgrade":
            migrate.upgrade(url, rev or "head")
            print(f"schema at {asyncio.run(migrate.current_revision(url))}")
        elif args.action == "downgrade":
            _confirm_downgrade(args, url, rev)
            migrate.downgrade(url, rev)
            print(f"schema at {asyncio.run(migrate.current_revision(url)) or 'base'}")
        elif args.action == "stamp":
            migrate.stamp(url, rev)
            print(f"schema recorded as {asyncio.run(migrate.current_revision(url)) or 'base'} "
                  "(nothing was run)")
        elif args.action in ("current", "check"):
            cur = asyncio.run(migrate.current_revision(url))
            head = migrate.head_revision()
            state = "up to date" if cur == head else f"behind head {head}"
            print(f"{cur or 'base (empty)'} ({state})")
            if args.action == "check" and cur != head:
                print("polyport: the schema is not at head: run 'polyport migrate'",
                      file=sys.stderr)
                return 1
        else:
            migrate.history(url)
    return 0


def _confirm_downgrade(args: argparse.Namespace, url: str, rev: str) -> None:
    """A downgrade drops what later revisions added, under whoever is serving:
    refuse while gateways are connected (unless --force), and ask first
    (unless --yes)."""
    sessions, clients = asyncio.run(migrate.gateway_sessions(url))
    if sessions and not args.force:
        raise CommandError(
            f"a gateway is serving from this database ({sessions} sessions, from {clients}): "
            "stop it first, or pass --force to downgrade under it")
    current = asyncio.run(migrate.current_revision(url)) or "base"
    question = (f"downgrade the schema from {current} to {rev}? What later revisions added "
                "is dropped")
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(f"{question}: pass --yes to confirm without a terminal")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CommandError("downgrade cancelled; nothing was changed")
