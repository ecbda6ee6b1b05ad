"""The ``polyport`` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from polyport.core import migrate
from polyport.core.commands import FromPosition, FromTime
from polyport.core.errors import PolyportError
from polyport.core.store import EventStore, StoreConfig
from polyport.gateway.config import DEFAULT_PORTS, ConfigError, GatewayConfig, load_config
from polyport.gateway.database import database_url
from polyport.gateway.embedded_pg import EmbeddedPostgresError
from polyport.gateway.status_cli import add_status_parser, run_status
from polyport.pipeline.cli import add_pipeline_parser
from polyport.pipeline.cli import run as run_pipeline

log = logging.getLogger("polyport")


LOG_FIELDS = ("protocol", "peer", "code")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in LOG_FIELDS:  # structured extras, e.g. on protocol error lines
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument("--database-url", help="PostgreSQL URL (default: embedded database)")
    p.add_argument("--data-dir", help="data directory of the embedded database")
    p.add_argument("--log-format", choices=("text", "json"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polyport", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    _common(serve)
    serve.add_argument("--host")
    serve.add_argument("--http-port")
    for name in DEFAULT_PORTS:
        serve.add_argument(f"--{name}-port", help=f"default {DEFAULT_PORTS[name]}; 'off' disables")

    mig = sub.add_parser("migrate", help="upgrade, downgrade or inspect the schema")
    _common(mig)
    mig.add_argument("action", nargs="?", default="upgrade",
                     choices=("upgrade", "downgrade", "current", "history"))
    mig.add_argument(
        "revision", nargs="?", help="target revision (upgrade: head; downgrade: required)"
    )

    users = sub.add_parser("users", help="manage users")
    _common(users)
    us = users.add_subparsers(dest="action", required=True)
    add = us.add_parser("add")
    add.add_argument("name")
    add.add_argument("--password", required=True)
    add.add_argument("--default-context", default="default")
    add.add_argument("--context", action="append", dest="contexts",
                     help="a context the user may use (repeat; none = every context)")
    us.add_parser("list")
    rm = us.add_parser("remove")
    rm.add_argument("name")
    pw = us.add_parser("passwd")
    pw.add_argument("name")
    pw.add_argument("--password", required=True)
    cx = us.add_parser("contexts")
    cx.add_argument("name")
    cx.add_argument("--context", action="append", dest="contexts")
    cx.add_argument("--default-context")

    binders = sub.add_parser("binders", help="manage binders")
    _common(binders)
    bs = binders.add_subparsers(dest="action", required=True)
    bc = bs.add_parser("create")
    bc.add_argument("name")
    bc.add_argument("--context", default="default")
    bc.add_argument("--stream-prefix", default="")
    bc.add_argument("--type", action="append", dest="types")
    bc.add_argument("--fold", choices=("merge", "replace"), default="merge")
    bs.add_parser("list")
    for action in ("drop", "rebuild"):
        b = bs.add_parser(action)
        b.add_argument("name")

    subs = sub.add_parser("subscriptions", help="manage durable subscriptions")
    _common(subs)
    ss = subs.add_subparsers(dest="action", required=True)
    ss.add_parser("list")
    reset = ss.add_parser("reset")
    reset.add_argument("name")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--position", type=int)
    where.add_argument("--time", help="ISO 8601 time")
    de = ss.add_parser("delete")
    de.add_argument("name")

    add_status_parser(sub, _common)

    add_pipeline_parser(sub, _common)
    return parser


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    overrides = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "action", "config", "revision") and v is not None
    }
    known = set(GatewayConfig.__dataclass_fields__)
    return load_config(args.config, overrides={k: v for k, v in overrides.items() if k in known})


# --- serve ---------------------------------------------------------------------


async def _serve(config: GatewayConfig) -> int:
    from polyport.gateway.app import Gateway

    gw = Gateway(config)
    await gw.start()
    for name, listener in gw.listeners.items():
        host, port = listener.address
        print(f"polyport: {name} listening on {host}:{port}", flush=True)
    if gw.http_address:
        print(f"polyport: http listening on {gw.http_address[0]}:{gw.http_address[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: no new connections, draining the writer")
    await gw.stop()
    log.info("stopped")
    return 0


# --- commands on the database --------------------------------------------------


async def _with_store(config: GatewayConfig, fn: Callable[[EventStore], Awaitable[int]]) -> int:
    loop = asyncio.get_running_loop()
    with database_url(config, say=False) as (url, embedded):
        if embedded:
            await loop.run_in_executor(None, migrate.upgrade, url, "head")
        else:
            await migrate.check_current(url)
        store = EventStore(StoreConfig(url, pool_min=1, pool_max=4, run_binders=False))
        await store.start()
        try:
            return await fn(store)
        finally:
            await store.close()


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


async def _users(args: argparse.Namespace, store: EventStore) -> int:
    u = store.users
    if args.action == "add":
        await u.add(args.name, args.password, default_context=args.default_context,
                    contexts=args.contexts)
        print(f"user {args.name} saved")
    elif args.action == "list":
        _print([x.as_json() for x in await u.list()])
    elif args.action == "remove":
        await u.remove(args.name)
        print(f"user {args.name} removed")
    elif args.action == "passwd":
        await u.set_password(args.name, args.password)
        print(f"password of {args.name} changed")
    elif args.action == "contexts":
        await u.set_contexts(args.name, args.contexts, args.default_context)
        print(f"contexts of {args.name} set")
    return 0


async def _binders(args: argparse.Namespace, store: EventStore) -> int:
    b = store.binders
    if args.action == "create":
        spec = await b.create(args.name, context=args.context, stream_prefix=args.stream_prefix,
                              types=args.types, fold=args.fold)
        _print(spec.as_json())
    elif args.action == "list":
        _print([s.as_json() for s in await b.list()])
    elif args.action == "drop":
        await b.drop(args.name)
        print(f"binder {args.name} dropped")
    elif args.action == "rebuild":
        await b.rebuild(args.name)
        print(f"binder {args.name} reset; running gateways refill it from the log")
    return 0


async def _subscriptions(args: argparse.Namespace, store: EventStore) -> int:
    if args.action == "list":
        _print(await store.list_subscriptions())
    elif args.action == "reset":
        sub_id = await store.subscription_id(args.name)
        if sub_id is None:
            print(f"no subscription named {args.name!r}", file=sys.stderr)
            return 1
        if args.time:
            t = datetime.fromisoformat(args.time)
            if t.tzinfo is None:
                t = t.replace(tzinfo=UTC)
            cursor = await store.seek(sub_id, FromTime(t))
        else:
            cursor = await store.seek(sub_id, FromPosition(args.position))
        print(f"subscription {args.name} now resumes after position {cursor}")
    elif args.action == "delete":
        if not await store.delete_subscription(args.name):
            print(f"no subscription named {args.name!r}", file=sys.stderr)
            return 1
        print(f"subscription {args.name} deleted")
    return 0


def _migrate(args: argparse.Namespace, config: GatewayConfig) -> int:
    with database_url(config, say=False) as (url, _embedded):
        if args.action == "upgrade":
            migrate.upgrade(url, args.revision or "head")
            print(f"schema at {asyncio.run(migrate.current_revision(url))}")
        elif args.action == "downgrade":
            if not args.revision:
                print("downgrade needs a target revision (e.g. 'base')", file=sys.stderr)
                return 2
            migrate.downgrade(url, args.revision)
            print(f"schema at {asyncio.run(migrate.current_revision(url)) or 'base'}")
        elif args.action == "current":
            cur = asyncio.run(migrate.current_revision(url))
            head = migrate.head_revision()
            state = "up to date" if cur == head else f"behind head {head}"
            print(f"{cur or 'base (empty)'} ({state})")
        else:
            migrate.history(url)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        setup_logging(config.log_format, config.log_level)
        if args.command == "serve":
            return asyncio.run(_serve(config))
        if args.command == "migrate":
            return _migrate(args, config)
        if args.command == "status":
            return asyncio.run(_with_store(config, lambda s: run_status(args, config, s)))
        if args.command == "pipeline":
            return run_pipeline(args, config)
        handler = {"users": _users, "binders": _binders, "subscriptions": _subscriptions}[
            args.command
        ]
        return asyncio.run(_with_store(config, lambda s: handler(args, s)))
    except (ConfigError, EmbeddedPostgresError, migrate.SchemaBehind, PolyportError) as exc:
        print(f"polyport: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
