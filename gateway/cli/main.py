"""polyport: one event store, reached in six native wire protocols.

Run ``polyport COMMAND --help`` for a command's options.  Options that find
the database and set up logging (``--config``, ``--database-url``,
``--data-dir``, ``--log-format``, ``--log-level``, ``--debug``) are accepted
before or after the command."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib.metadata
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import urlsplit

from polyport.core import migrate
from polyport.core.commands import FromPosition, FromTime, Selector
from polyport.core.events import DEFAULT_CONTEXT
from polyport.core.parking import SubscriptionSettings
from polyport.core.store import EventStore, StoreConfig
from polyport.gateway.cli.connections_cli import AdminError, add_connections_parser, run_connections
from polyport.gateway.cli.status_cli import add_status_parser, run_status
from polyport.gateway.cli.tables import Column, cell, table
from polyport.gateway.config import (
    DEFAULT_HTTP_PORT,
    DEFAULT_PORTS,
    EVENT_LOOPS,
    LOG_FORMATS,
    LOG_LEVELS,
    TLS_LISTENERS,
    ConfigError,
    GatewayConfig,
    config_from_args,
    tls_keys,
)
from polyport.gateway.process.announce import Announcement, announce, notify_systemd
from polyport.gateway.process.data_dir import DataDirLock
from polyport.gateway.process.database import database_url
from polyport.gateway.process.eventloop import LoopChoice, choose_loop
from polyport.gateway.process.eventloop import run as run_on_loop
from polyport.gateway.process.fatal import describe
from polyport.gateway.process.logging_setup import (
    JsonFormatter as JsonFormatter,  # tests name it here
)
from polyport.gateway.process.logging_setup import setup_logging
from polyport.gateway.process.ports_file import remove_ports_file, write_ports_file
from polyport.pipeline.cli import add_pipeline_parser
from polyport.pipeline.cli import run as run_pipeline

log = logging.getLogger("polyport")


class Parser(argparse.ArgumentParser):
    """Usage errors in one line that points at --help (argparse's default is
    the whole usage block, several lines, before the error)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: "--password" must never be taken for "--password-stdin".
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see '{self.prog} --help'\n")


def _version() -> str:
    try:
        return importlib.metadata.version("polyport")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source tree only
        return "unknown"


def _common(p: argparse.ArgumentParser) -> None:
    """Options every command takes, before or after its name.  SUPPRESS keeps a
    subcommand's absent option from hiding the same option given earlier."""
    s = argparse.SUPPRESS
    p.add_argument("--config", default=s, metavar="FILE",
                   help="TOML configuration file (env POLYPORT_CONFIG)")
    p.add_argument("--database-url", default=s, metavar="URL",
                   help="PostgreSQL URL, postgresql://user:password@host:port/db "
                        "(default: the embedded database under --data-dir)")
    p.add_argument("--database-url-file", default=s, metavar="FILE",
                   help="read the PostgreSQL URL from the first line of FILE (mode 0600), "
                        "so its password is not in argv")
    p.add_argument("--data-dir", default=s, metavar="DIR",
                   help="data directory of the embedded database and gateway.json "
                        "(default /var/lib/polyport as root, else ~/.local/share/polyport)")
    p.add_argument("--log-format", default=s, choices=LOG_FORMATS,
                   help="log lines as text (default) or JSON, fatal errors included")
    p.add_argument("--log-level", default=s, choices=LOG_LEVELS,
                   help="least severe level logged (default info); debug also shows tracebacks")
    p.add_argument("--debug", action="store_true", default=s,
                   help="show the traceback of a fatal error")


def _leaf(sub: Any, name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help, **kw)
    _common(p)
    return p


class _RefusePassword(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kw: Any) -> None:
        # The value is not echoed: it is the secret.
        parser.error("--password is not accepted (a password in argv is visible to every "
                     "user of this machine): use the prompt or --password-stdin")


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _context_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context", default=DEFAULT_CONTEXT,
                   help="the context the name belongs to (default: %(default)s)")


def _scope_options(p: argparse.ArgumentParser) -> None:
    """--context … or --all-contexts, one of them: a forgotten --context must
    not grant every tenant."""
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--context", action="append", dest="contexts", metavar="CONTEXT",
                       help="a context the user may use (repeat)")
    scope.add_argument("--all-contexts", action="store_true",
                       help="the user may use every context, present and future")


def _password_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--password", nargs="?", action=_RefusePassword, help=argparse.SUPPRESS)
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of standard input "
                        "(default: prompt on the terminal); never give it on the command line")


_TLS_HELP = {
    "cert": "PEM certificate chain: every TCP listener and HTTP speak TLS (docs/operations.md)",
    "key": "PEM private key of --tls-cert (must not be readable by other users)",
    "client_ca": "PEM CA bundle: client certificates it signed log in as the user they name",
    "min_version": "lowest TLS version: 1.2 (default) or 1.3",
    "mode": "required (default with a certificate), dual (plain and TLS on one port) or off",
    "user_from": "where a client certificate names its user: cn (default), san-email, "
                 "san-dns, san-uri",
}


def _tls_options(p: argparse.ArgumentParser) -> None:
    """--tls-* for every listener; --NAME-tls MODE and --NAME-tls-* per listener."""
    for key, (fld, opt) in tls_keys().items():
        flag = "--" + key.replace("_", "-")
        if fld == "tls":
            p.add_argument(flag, metavar=opt.upper(), help=_TLS_HELP[opt])
        elif key == fld:
            p.add_argument(flag, metavar="MODE",
                           help=f"{fld[:-4]}: TLS required, dual or off (over --tls-mode); "
                                f"--{fld.replace('_', '-')}-cert etc. override --tls-* for it")
        else:
            p.add_argument(flag, help=argparse.SUPPRESS)
    p.add_argument("--res01-curve", metavar="on|off",
                   help="ZeroMQ CURVE on the Res01 socket (client keys: 'polyport keys')")
    p.add_argument("--res01-curve-key-file", metavar="FILE",
                   help="Z85 CURVE secret key of the server (default: generated into the data "
                        "directory)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="polyport",
        description="polyport: one event store, reached in six native wire protocols.",
        epilog="Run 'polyport COMMAND --help' for a command's options.  The options above "
               "are accepted before or after the command.",
    )
    parser.add_argument("--version", action="version", version=f"polyport {_version()}")
    _common(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _leaf(sub, "serve", "run the gateway: every protocol listener and the HTTP port")
    serve.add_argument("--host", help="address every listener binds (default 127.0.0.1)")
    serve.add_argument("--http-port", metavar="N",
                       help=f"HTTP port: health, status, metrics, admin (default "
                            f"{DEFAULT_HTTP_PORT}; 'off' disables, 0 picks a free one)")
    for name in DEFAULT_PORTS:
        serve.add_argument(f"--{name}-port", metavar="N",
                           help=f"{name} listener port (default {DEFAULT_PORTS[name]}; "
                                "'off' disables, 0 picks a free one)")
    _tls_options(serve)
    serve.add_argument("--res01-login-port", metavar="N",
                       help="a second Res01 port that requires a ZeroMQ PLAIN login "
                            "(default off; 0 picks a free one)")
    serve.add_argument("--websocket-allowed-origins", metavar="ORIGINS",
                       help="comma-separated browser origins (https://app.example) whose "
                            "pages may open WebSocket endpoints (default: none)")
    serve.add_argument("--event-loop", choices=EVENT_LOOPS,
                       help="asyncio event loop: uvloop, asyncio, or auto (default: uvloop "
                            "when it can be imported)")
    serve.add_argument("--workers", metavar="N|auto",
                       help="gateway processes sharing the TCP ports (default 1; auto = one "
                            "per core); Res01 and HTTP run in the first (docs/operations.md)")

    mig = _leaf(sub, "migrate", "upgrade, downgrade or inspect the database schema")
    mig.add_argument("action", nargs="?", default="upgrade",
                     choices=("upgrade", "downgrade", "current", "history", "stamp", "check"),
                     help="upgrade (default), downgrade REV, current, history, stamp REV "
                          "(record REV without running it), check (exit 1 unless at head)")
    mig.add_argument("revision", nargs="?",
                     help="target revision (upgrade: default head; downgrade, stamp: required)")
    mig.add_argument("--sql", action="store_true",
                     help="print the SQL of upgrade/downgrade instead of running it (offline; "
                          "downgrade takes FROM:TO)")
    mig.add_argument("--yes", action="store_true",
                     help="downgrade without asking first (needed without a terminal)")
    mig.add_argument("--force", action="store_true",
                     help="downgrade even while a gateway is connected to the database")

    users = sub.add_parser("users", help="manage users", description="manage users")
    _common(users)
    us = users.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = _leaf(us, "add", "add or replace a user")
    add.add_argument("name", help="user name")
    _password_options(add)
    add.add_argument("--default-context",
                     help="context the user acts in when a request names none (one of its "
                          "contexts; default: the first --context, else 'default')")
    _scope_options(add)
    _json_option(_leaf(us, "list", "list users (never their passwords)"))
    rm = _leaf(us, "remove", "remove a user")
    rm.add_argument("name", help="user name")
    pw = _leaf(us, "passwd", "change a user's password")
    pw.add_argument("name", help="user name")
    _password_options(pw)
    cx = _leaf(us, "contexts", "set the contexts a user may use")
    cx.add_argument("name", help="user name")
    _scope_options(cx)
    cx.add_argument("--default-context", help="context used when a request names none")

    keys = sub.add_parser("keys", help="manage Res01 CURVE client keys",
                          description="manage Res01 CURVE client keys (docs/operations.md)")
    _common(keys)
    ks = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    kc = _leaf(ks, "create", "create a CURVE key pair for a user: prints the secret key once, "
                             "stores only the public key")
    kc.add_argument("name", help="user name")
    _json_option(_leaf(ks, "list", "list CURVE public keys and their users"))
    kr = _leaf(ks, "remove", "remove a CURVE public key")
    kr.add_argument("public_key", help="the Z85 public key")

    binders = sub.add_parser("binders", help="manage binders (queryable projections)",
                             description="manage binders (queryable projections)")
    _common(binders)
    bs = binders.add_subparsers(dest="action", required=True, metavar="ACTION")
    bc = _leaf(bs, "create", "create a binder kept current from the log")
    bc.add_argument("name", help="binder name")
    bc.add_argument("--context", default="default", help="context it reads (default 'default')")
    bc.add_argument("--stream-prefix", default="",
                    help="streams it reads: those starting with this prefix (default all)")
    bc.add_argument("--type", action="append", dest="types", metavar="TYPE",
                    help="event type it folds (repeat; none = every type)")
    bc.add_argument("--fold", choices=("merge", "replace"), default="merge",
                    help="merge: shallow-merge each event body into the document (default); "
                         "replace: the last body wins")
    bl = _leaf(bs, "list", "list binders with their position and document count")
    _json_option(bl)
    bl.add_argument("--context", help="only the binders of this context")
    for action, text in (("drop", "drop a binder and its documents"),
                         ("rebuild", "reset a binder so running gateways refill it")):
        b = _leaf(bs, action, text)
        b.add_argument("name", help="binder name")

    subs = sub.add_parser("subscriptions", help="manage durable subscriptions",
                          description="manage durable subscriptions")
    _common(subs)
    ss = subs.add_subparsers(dest="action", required=True, metavar="ACTION")
    sl = _leaf(ss, "list", "list durable subscriptions with checkpoint and lag")
    _json_option(sl)
    sl.add_argument("--context", help="only the subscriptions of this context")
    sh = _leaf(ss, "show", "one subscription: selector, settings, checkpoint, lag, parked")
    sh.add_argument("name", help="subscription name")
    _context_option(sh)
    _json_option(sh)
    reset = _leaf(ss, "reset", "move a subscription's checkpoint")
    reset.add_argument("name", help="subscription name")
    _context_option(reset)
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--position", type=int, help="resume after this log position")
    where.add_argument("--time", type=_iso_time,
                       help="resume at the first event at or after this ISO 8601 time")
    de = _leaf(ss, "delete", "delete a subscription and its checkpoint")
    de.add_argument("name", help="subscription name")
    cr = _leaf(ss, "create", "create a persistent subscription with its settings")
    cr.add_argument("name", help="subscription name (as its consumers name it)")
    cr.add_argument("--context", required=True, help="context it reads")
    which = cr.add_mutually_exclusive_group()
    which.add_argument("--stream", help="read this stream only")
    which.add_argument("--prefix", help="read the streams starting with this")
    cr.add_argument("--type", action="append", dest="types", metavar="TYPE",
                    help="event type it reads (repeat; none = every type)")
    up = _leaf(ss, "update", "change a subscription's settings (options not given stay)")
    up.add_argument("name", help="subscription name")
    _context_option(up)
    for p in (cr, up):
        p.add_argument("--start", type=_start_setting,
                       help="beginning, end (default), a log position, or an "
                                       "ISO 8601 time (on update: kept for the record; "
                                       "'reset' moves a checkpoint)")
        p.add_argument("--max-in-flight", type=_limit, metavar="N|none",
                       help="unacknowledged events handed out at once")
        p.add_argument("--max-retries", type=_limit, metavar="N|none",
                       help="failures after which an event is parked (none = never)")
        p.add_argument("--message-timeout", type=_seconds, metavar="SECONDS|none",
                       help="how long a consumer may hold an event unacknowledged")
    pk = _leaf(ss, "parked", "list the events parked after too many retries")
    pk.add_argument("name", help="subscription name")
    _context_option(pk)
    _json_option(pk)
    rp = _leaf(ss, "replay-parked", "hand the parked events out again (a running gateway "
                                    "picks the request up within seconds)")
    rp.add_argument("name", help="subscription name")
    _context_option(rp)

    add_status_parser(sub, _common)
    add_connections_parser(sub, _common)

    add_pipeline_parser(sub, _common)
    return parser


def _password_in_argv(args: argparse.Namespace) -> bool:
    """--database-url's value carries a password: every user of the machine
    can read it in the process list."""
    url = getattr(args, "database_url", None)
    try:
        return bool(url and urlsplit(url).password)
    except ValueError:  # not a URL: load_config has said so
        return False


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


# --- serve ---------------------------------------------------------------------


def _stop_then_hurry(stop: asyncio.Event, hurry: asyncio.Event) -> None:
    """The first SIGTERM/SIGINT starts a graceful stop; a second cuts its
    grace period short."""
    if stop.is_set():
        hurry.set()
    stop.set()


async def _serve(config: GatewayConfig, args: argparse.Namespace, choice: LoopChoice) -> int:
    from polyport.gateway.app import Gateway
    from polyport.gateway.process.eventloop import settle_heap

    log.info("event loop: %s", choice.describe())
    gw = Gateway(config)
    await gw.start()
    settle_heap()
    # Before the lines below: whoever waits for them may signal at once.
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _stop_then_hurry, stop, hurry)
    loop.add_signal_handler(signal.SIGHUP, lambda: _reload(gw, args))
    # Written before the lines below: whoever waits for them can read it.
    ports_file = write_ports_file(config.data_dir, gw)
    curve = getattr(gw.listeners.get("res01"), "curve", None)
    announce(Announcement(
        listeners={name: li.address for name, li in gw.listeners.items()},
        http=gw.http_address, https="http" in gw.tls,
        curve_public_key=curve.public_key if curve is not None else None,
        admin_api=bool(config.admin_token)), config.log_format)
    try:
        await stop.wait()
        notify_systemd("STOPPING=1")
        log.info("shutting down: unready, no new connections; in-flight requests get up to "
                 "%.0f s (shutdown_grace), then the writer drains", config.shutdown_grace)
        await gw.drain(config.shutdown_grace, hurry)
        await gw.stop()
    finally:
        remove_ports_file(ports_file)
    log.info("stopped")
    return 0


# admin_token: admin.py reads it per request, so a new token applies at once.
RELOADABLE = ("log_level", "log_format", "admin_token")
# Never written to the log, not even on reload.
SECRET_SETTINGS = frozenset({"admin_token", "database_url"})
# Certificates and keys: gw.reload_tls (modes and client CAs need a restart).
TLS_FIELDS = ("tls", *(f"{n}_tls" for n in TLS_LISTENERS))


def _reload(
    gw: Any,
    args: argparse.Namespace,
    adjust: Callable[[GatewayConfig], GatewayConfig] | None = None,
) -> None:
    """SIGHUP: read the configuration again (file, environment, the original
    flags) and apply what can change while running; never stop the process.
    ``adjust``: a worker's view of the configuration (WorkerRole.apply)."""
    try:
        new = config_from_args(args)
        if adjust is not None:
            new = adjust(new)
    except Exception as exc:
        log.error("reload refused, nothing changed: %s", describe(exc))
        return
    old = gw.config
    try:
        reloaded = gw.reload_tls(new)
    except Exception as exc:
        log.error("TLS reload refused, the running certificates stay: %s", describe(exc))
        reloaded = []
        new = replace(new, **{k: getattr(old, k) for k in TLS_FIELDS})
    if reloaded:
        log.info("reloaded TLS certificates of %s", ", ".join(reloaded))
    changed = {k: (getattr(old, k), getattr(new, k)) for k in RELOADABLE
               if getattr(old, k) != getattr(new, k)}
    if changed:
        setup_logging(new.log_format, new.log_level)
    gw.config = replace(old, **{k: v for k, (_o, v) in changed.items()},
                        **{k: getattr(new, k) for k in TLS_FIELDS})
    pending = sorted(
        k for k in GatewayConfig.__dataclass_fields__
        if k not in RELOADABLE and k not in TLS_FIELDS and getattr(old, k) != getattr(new, k)
    )
    said = ", ".join(f"{k} changed" if k in SECRET_SETTINGS else f"{k} {a} -> {b}"
                     for k, (a, b) in changed.items()) or "nothing changed"
    log.info("reloaded configuration: %s%s", said,
             f"; needs a restart: {', '.join(pending)}" if pending else "")


# --- commands on the database --------------------------------------------------


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


_NONE = object()


def _limit(text: str) -> object:
    return _NONE if text.lower() == "none" else int(text)


def _seconds(text: str) -> object:
    return _NONE if text.lower() == "none" else float(text)


def _iso_time(text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone); a usage error otherwise."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-11-27T09:30:00Z, got {text!r}") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _start_setting(text: str) -> Any:
    if text in ("beginning", "end"):
        return text
    if text.isdigit():
        return {"position": int(text)}
    try:
        return {"time": _iso_time(text).isoformat()}
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected beginning, end, a log position or an ISO 8601 time, got {text!r}"
        ) from None


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


class CommandError(Exception):
    """A command cannot go on; the message says what to do instead."""


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


def _say_fatal(message: str, fmt: str) -> None:
    if fmt == "json":  # the same record shape as every other log line
        record = logging.makeLogRecord(
            {"name": "polyport", "levelname": "ERROR", "levelno": logging.ERROR, "msg": message}
        )
        print(JsonFormatter().format(record), file=sys.stderr)
    else:
        print(f"polyport: {message}", file=sys.stderr)


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
    except Exception as exc:
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
