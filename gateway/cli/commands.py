"""The commands on the event store: ``users``, ``keys``, ``binders`` and
``subscriptions``, each run on a store of its own, with their tables and the
password prompt."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from polyport.core import migrate
from polyport.core.commands import FromPosition, FromTime, Selector
from polyport.core.parking import SubscriptionSettings
from polyport.core.store import EventStore, StoreConfig
from polyport.gateway.cli.parser import _NONE
from polyport.gateway.cli.tables import Column, cell, table
from polyport.gateway.config import GatewayConfig
from polyport.gateway.process.database import database_url


class CommandError(Exception):
    """A command cannot go on; the message says what to do instead."""


def read_password(args: argparse.Namespace) -> str:
    """The new password: a line of stdin with --password-stdin, else a prompt."""
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise CommandError("the two passwords differ; nothing was changed")
    else:
        raise CommandError(
            "no terminal to ask for the password: pipe it in with --password-stdin"
        )
    if not password:
        raise CommandError("empty password; nothing was changed")
    return password


async def _with_store(config: GatewayConfig, fn: Callable[[EventStore], Awaitable[int]],
                      *, start_database: bool = True) -> int:
    loop = asyncio.get_running_loop()
    with database_url(config, say=False, create=False, start=start_database) as (url, embedded):
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


def _list(args: argparse.Namespace, rows: list[dict[str, Any]], columns: Sequence[Column],
          empty: str) -> None:
    """A list command's output: a table, or the rows as JSON with --json."""
    if args.json:
        _print(rows)
    else:
        print(table(rows, columns, empty))


_SUBSCRIPTION_COLUMNS: tuple[Column, ...] = (
    ("NAME", lambda r: r["name"]), ("CONTEXT", lambda r: r["context"]),
    ("STREAM", lambda r: r["selector"].get("stream") or r["selector"].get("prefix") or "(all)"),
    ("CHECKPOINT", lambda r: r["checkpoint"]), ("LAG", lambda r: r["lag_events"]),
    ("PARKED", lambda r: r["parked"]),
)


def _show(args: argparse.Namespace, sub: dict[str, Any]) -> None:
    if args.json:
        _print(sub)
        return
    sel, settings = sub["selector"], sub["settings"]
    for label, value in (
        ("name", sub["name"]), ("context", sub["context"]),
        ("stream", sel.get("stream")), ("prefix", sel.get("prefix")),
        ("types", sel.get("types")), ("checkpoint", sub["checkpoint"]),
        ("lag", f"{sub['lag_events']} events"), ("parked", sub["parked"]),
        ("updated", sub["updated_at"][:19]),
        *((k.replace("_", " "), v) for k, v in settings.items()),
    ):
        print(f"{label:<16}{cell(value)}")


async def _users(args: argparse.Namespace, store: EventStore) -> int:
    u = store.users
    if args.action == "add":
        await u.add(args.name, args.new_password, default_context=args.default_context,
                    contexts=args.contexts)
        print(f"user {args.name} saved")
    elif args.action == "list":
        _list(args, [x.as_json() for x in await u.list()], (
            ("NAME", lambda r: r["name"]), ("DEFAULT CONTEXT", lambda r: r["default_context"]),
            ("CONTEXTS", lambda r: r["contexts"] if r["contexts"] is not None else "(all)"),
            ("CREATED", lambda r: r["created_at"][:19]),
        ), "no users")
    elif args.action == "remove":
        await u.remove(args.name)
        print(f"user {args.name} removed")
    elif args.action == "passwd":
        await u.set_password(args.name, args.new_password)
        print(f"password of {args.name} changed")
    elif args.action == "contexts":
        await u.set_contexts(args.name, args.contexts, args.default_context)
        print(f"contexts of {args.name} set")
    return 0


async def _keys(args: argparse.Namespace, store: EventStore) -> int:
    from polyport.gateway.transports.curve import new_key_pair

    u = store.users
    if args.action == "create":
        keys = new_key_pair()
        await u.add_curve_key(args.name, keys.public)
        # The secret is shown this once and stored nowhere.
        print(f"user {args.name}: CURVE key pair created; only the public key is stored")
        print(f"public key: {keys.public}")
        print(f"secret key: {keys.secret}")
    elif args.action == "list":
        _list(args, [dict(k) for k in await u.curve_keys()], (
            ("PUBLIC KEY", lambda r: r["public_key"]), ("USER", lambda r: r["user_name"]),
            ("CREATED", lambda r: str(r["created_at"])[:19]),
        ), "no CURVE keys")
    elif args.action == "remove":
        await u.remove_curve_key(args.public_key)
        print(f"CURVE key {args.public_key} removed")
    return 0


async def _binders(args: argparse.Namespace, store: EventStore) -> int:
    b = store.binders
    if args.action == "create":
        spec = await b.create(args.name, context=args.context, stream_prefix=args.stream_prefix,
                              types=args.types, fold=args.fold)
        _print(spec.as_json())
    elif args.action == "list":
        found = [s.as_json() for s in await b.list()]
        _list(args, [x for x in found if args.context in (None, x["context"])], (
            ("NAME", lambda r: r["name"]), ("CONTEXT", lambda r: r["context"]),
            ("STREAM PREFIX", lambda r: r["stream_prefix"]), ("TYPES", lambda r: r["types"]),
            ("POSITION", lambda r: r["position"]), ("DOCUMENTS", lambda r: r["documents"]),
            ("FAILURES", lambda r: r["failures"]["count"]),
        ), "no binders")
    elif args.action == "drop":
        await b.drop(args.name)
        print(f"binder {args.name} dropped")
    elif args.action == "rebuild":
        await b.rebuild(args.name)
        print(f"binder {args.name} reset; running gateways refill it from the log")
    return 0


def _setting_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The settings options given on the command line ('none' clears a limit)."""
    changes: dict[str, Any] = {}
    if args.start is not None:
        changes["start"] = args.start
    for key in ("max_in_flight", "max_retries", "message_timeout"):
        value = getattr(args, key)
        if value is not None:
            changes[key] = None if value is _NONE else value
    return changes


def _no_subscription(args: argparse.Namespace) -> str:
    return (f"no subscription named {args.name!r} in context {args.context!r}; "
            "'polyport subscriptions list' lists them")


async def _subscriptions(args: argparse.Namespace, store: EventStore) -> int:
    if args.action == "list":
        found = await store.list_subscriptions()
        _list(args, [x for x in found if args.context in (None, x["context"])],
              _SUBSCRIPTION_COLUMNS, "no durable subscriptions")
    elif args.action == "show":
        matching = [x for x in await store.list_subscriptions()
                    if (x["context"], x["name"]) == (args.context, args.name)]
        if not matching:
            raise CommandError(_no_subscription(args))
        _show(args, matching[0])
    elif args.action == "create":
        selector = Selector(context=args.context, stream=args.stream, prefix=args.prefix,
                            types=frozenset(args.types or ()))
        settings = SubscriptionSettings().merged(_setting_changes(args))
        if not await store.create_subscription(args.name, selector, settings):
            raise CommandError(
                f"subscription {args.name!r} already exists; 'update' changes its settings")
        [sub] = [s for s in await store.list_subscriptions() if s["name"] == args.name]
        _print(sub)
    elif args.action == "update":
        await store.update_subscription(args.context, args.name, _setting_changes(args))
        [sub] = [s for s in await store.list_subscriptions() if s["name"] == args.name]
        _print(sub)
    elif args.action == "parked":
        _list(args, [p.as_json() for p in await store.parked_events(args.context, args.name)], (
            ("POSITION", lambda r: r["position"]), ("STREAM", lambda r: r["stream"]),
            ("VERSION", lambda r: r["version"]), ("TYPE", lambda r: r["type"]),
            ("RETRIES", lambda r: r["retries"]), ("REASON", lambda r: r["reason"]),
            ("PARKED AT", lambda r: r["parked_at"][:19]),
            ("REPLAY", lambda r: "yes" if r["replay"] else "no"),
        ), f"no parked events for {args.name}")
    elif args.action == "replay-parked":
        count = await store.replay_parked(args.context, args.name)
        print(f"{count} parked events of {args.name} marked for replay; the gateway owning "
              "the subscription hands them out again")
    elif args.action == "reset":
        sub_id = await store.subscription_id(args.context, args.name)
        if sub_id is None:
            raise CommandError(_no_subscription(args))
        if args.time:
            cursor = await store.seek(sub_id, FromTime(args.time))
        else:
            cursor = await store.seek(sub_id, FromPosition(args.position))
        print(f"subscription {args.name} in {args.context} now resumes after position {cursor}")
    elif args.action == "delete":
        if not await store.delete_subscription(args.context, args.name):
            raise CommandError(_no_subscription(args))
        print(f"subscription {args.name} in {args.context} deleted")
    return 0
