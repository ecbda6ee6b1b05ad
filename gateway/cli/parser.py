"""The ``polyport`` argument parser: every command, its options and their
help, and the argument types that check values as they are parsed."""

from __future__ import annotations

import argparse
import importlib.metadata
from datetime import UTC, datetime
from typing import Any, NoReturn

from polyport.core.events import DEFAULT_CONTEXT
from polyport.gateway.cli.connections_cli import add_connections_parser
from polyport.gateway.cli.status_cli import add_status_parser
from polyport.gateway.config import (
    DEFAULT_HTTP_PORT,
    DEFAULT_PORTS,
    EVENT_LOOPS,
    LOG_FORMATS,
    LOG_LEVELS,
    tls_keys,
)
from polyport.pipeline.cli import add_pipeline_parser


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


def _serve_command(sub: Any) -> None:
    """``polyport serve``: listeners, ports, TLS, event loop and workers."""
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


def _migrate_command(sub: Any) -> None:
    """``polyport migrate [ACTION] [REVISION]``."""
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


def _users_command(sub: Any) -> None:
    """``polyport users add|list|remove|passwd|contexts``."""
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


def _keys_command(sub: Any) -> None:
    """``polyport keys create|list|remove``."""
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


def _binders_command(sub: Any) -> None:
    """``polyport binders create|list|drop|rebuild``."""
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


def _subscriptions_command(sub: Any) -> None:
    """``polyport subscriptions list|show|reset|delete|create|update|parked|replay-parked``."""
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

    _serve_command(sub)
    _migrate_command(sub)
    _users_command(sub)
    _keys_command(sub)
    _binders_command(sub)
    _subscriptions_command(sub)

    add_status_parser(sub, _common)
    add_connections_parser(sub, _common)

    add_pipeline_parser(sub, _common)
    return parser
