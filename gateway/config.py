"""Gateway configuration: defaults, then a TOML file, then ``POLYPORT_*``
environment variables, then command-line flags (later wins).

Default ports live in :data:`DEFAULT_PORTS`; a port of ``off`` disables that
listener and 0 picks a free one.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import stat
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_HTTP_PORT = 8080
DEFAULT_PORTS: dict[str, int] = {
    "res01": 5560,
    "bson": 7451,
    "reactivesocket": 7070,
    "rsocket": 7878,
    "micromsg2": 7090,
    "segment": 12345,
}
# Before issue 29 the default was ./polyport-data, so a command run from
# another directory made a new, empty cluster; `serve` still recognises it.
OLD_DEFAULT_DATA_DIR = "polyport-data"


def default_data_dir() -> str:
    """The data directory when none is given: the same from every working
    directory.  /var/lib/polyport for root (a service), else the XDG data
    directory (~/.local/share/polyport)."""
    if os.geteuid() == 0:
        return "/var/lib/polyport"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "polyport")


# gateway/process/eventloop.py: auto = uvloop when it can be imported, else asyncio.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# Where the commit chain of ``--workers N`` runs (core/chain.py): a process of
# its own, inside the last worker, or nowhere (each worker commits itself);
# auto: a process when the machine has a core to spare for it, else a worker.
COMMIT_CHAINS = ("auto", "process", "worker", "off")
# auto: on when this process may use at least PLANNED_POSITIONS_MIN_CORES
# cores.  On 2 cores the CPU, not the head row, is the limit: W1 gained
# nothing beyond the machine's noise and W3 cost PostgreSQL more CPU
# (docs/performance.md, session 21).
PLANNED_POSITIONS = ("auto", "on", "off")
PLANNED_POSITIONS_MIN_CORES = 4
# Batches a writer keeps in flight at once (core/writer.py).  auto: 2 where
# commits at planned positions are on, whose second commit inserts its
# events beside the first's, and in a commit chain process; else 1.
# Without planned positions the second batch only waits on the head row,
# and the writer splits what is queued between the two: on 2 cores that
# made twice the commits of half the size, and one batch in flight cost
# 1-13 % less CPU per event with lower W3 latency.  A chain process, whose
# core has nothing else to do, carried 11 % more events with two at the
# same CPU per event (docs/performance.md, session 26).
MAX_PIPELINE_DEPTH = 8
# How the kernel schedules the gateway's processes (gateway/process/scheduling.py):
# the default policy, SCHED_BATCH for all (W1 throughput against W3 latency
# on a saturated machine with several workers), or SCHED_BATCH only for the
# workers that forward their appends to a commit chain (less CPU per event
# where the cores are not all busy, more where they are); the module says
# what was measured.
CPU_SCHEDULINGS = ("normal", "batch", "forwarders")
# --workers: more than this is a typo, not a machine.
MAX_WORKERS = 256

# Listeners that can speak TLS (Res01 is ZeroMQ: CURVE instead, see res01_curve).
TLS_LISTENERS = ("bson", "reactivesocket", "rsocket", "micromsg2", "segment", "http")
TLS_OPTIONS = ("cert", "key", "client_ca", "min_version", "mode", "user_from")
TLS_MODES = ("off", "required", "dual")
TLS_VERSIONS = ("1.2", "1.3")
# Where a client certificate names its polyport user: the subject's CN or the
# first subjectAltName of one kind.
TLS_USER_FROM = ("cn", "san-email", "san-dns", "san-uri")


class ConfigError(ValueError):
    pass


def check_private_file(path: Path, what: str, instead: str = "") -> None:
    """Refuse a file holding a secret (a key, a token) that users other than
    its owner may read: ConfigError, one line with the fix.  ``what`` names
    the setting, ``instead`` a way around the file."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:  # group too: nobody but the owner needs the secret
        raise ConfigError(
            f"{what} {path} is readable by other users (mode {mode:04o}); "
            f"run chmod 600 {path}{instead}"
        )


def parse_port(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "off":
            return None
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"{key}: expected a port number or 'off', got {value!r}") from None
    if not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(f"{key}: port must be 0..65535 or 'off', got {value!r}")
    return value


def _parse_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _parse_choice(value: Any, where: str, choices: tuple[str, ...], true: str) -> str:
    """One of ``choices``; a boolean spelling means ``true`` or "off"."""
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    if text in choices:
        return text
    try:
        return true if _parse_bool(value, where) else "off"
    except ConfigError:
        raise ConfigError(f"{where}: expected one of {', '.join(choices)}, "
                          f"got {value!r}") from None


def planned_positions(config: GatewayConfig) -> bool:
    """Whether the gateway's sole writer commits at planned positions."""
    if config.planned_positions == "auto":
        return available_cores() >= PLANNED_POSITIONS_MIN_CORES
    return config.planned_positions == "on"


def pipeline_depth(config: GatewayConfig, *, dedicated: bool = False) -> int:
    """Batches in flight at once for one of the gateway's writers;
    ``dedicated``: a commit chain process's (see MAX_PIPELINE_DEPTH's
    comment)."""
    if config.pipeline_depth == "auto":
        return 2 if dedicated or planned_positions(config) else 1
    return int(config.pipeline_depth)


def _parse_pipeline_depth(value: Any, where: str) -> str:
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    if text == "auto":
        return text
    if text.isdigit() and 1 <= int(text) <= MAX_PIPELINE_DEPTH:
        return str(int(text))
    raise ConfigError(f"{where}: expected 1..{MAX_PIPELINE_DEPTH} batches in flight or "
                      f"'auto', got {value!r}")


def _parse_networks(value: Any, where: str) -> tuple[str, ...]:
    """Networks in CIDR form (a bare address is one host), normalised."""
    out = []
    for item in _parse_list(value, where):
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ConfigError(f"{where}: {item!r} is not an IP network (CIDR)") from None
    return tuple(out)


def _parse_list(value: Any, key: str) -> tuple[str, ...]:
    """A TOML array, or comma-separated text (environment, command line)."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(v).strip() for v in value]
    else:
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    return tuple(v for v in items if v)


@dataclass(frozen=True)
class TlsOptions:
    """TLS settings of one listener, or the defaults every listener inherits
    (``GatewayConfig.tls``).  None = inherit; see :meth:`GatewayConfig.tls_for`."""

    cert: str | None = None  # PEM certificate chain, leaf first
    key: str | None = None  # PEM private key (mode 0600)
    client_ca: str | None = None  # PEM bundle: client certificates it signed log in
    min_version: str | None = None  # "1.2" (default) or "1.3"
    # off, required (the default once a certificate is configured), dual
    # (plain and TLS on one port, told apart by the first bytes).
    mode: str | None = None
    user_from: str | None = None  # cn (default), san-email, san-dns, san-uri

    def over(self, base: TlsOptions) -> TlsOptions:
        """These options, with what is unset taken from ``base``."""
        return TlsOptions(*(
            mine if mine is not None else getattr(base, name)
            for name, mine in ((n, getattr(self, n)) for n in TLS_OPTIONS)
        ))

    @property
    def enabled(self) -> bool:
        return self.cert is not None and self.mode != "off"


@dataclass(frozen=True)
class GatewayConfig:
    database_url: str | None = None
    data_dir: str = field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    http_port: int | None = DEFAULT_HTTP_PORT
    res01_port: int | None = DEFAULT_PORTS["res01"]
    bson_port: int | None = DEFAULT_PORTS["bson"]
    reactivesocket_port: int | None = DEFAULT_PORTS["reactivesocket"]
    rsocket_port: int | None = DEFAULT_PORTS["rsocket"]
    micromsg2_port: int | None = DEFAULT_PORTS["micromsg2"]
    segment_port: int | None = DEFAULT_PORTS["segment"]
    # A second Res01 endpoint that always requires a ZAP PLAIN login, beside
    # res01_port (anonymous NULL while allow_anonymous is on): ZeroMQ speaks
    # one mechanism per socket.  None (default) = no such endpoint.
    res01_login_port: int | None = None
    # Networks (CIDR) whose peers may complete a Res01 handshake, checked by
    # ZAP before any message is read; empty = every address.  libzmq holds
    # every part of a multipart message until its last, without limit, so
    # this (or CURVE/PLAIN) is what keeps unknown peers from doing that.
    res01_allow_from: tuple[str, ...] = ()
    allow_anonymous: bool = True
    # Browser origins (scheme://host[:port]) whose pages may open the
    # WebSocket endpoints; empty = every handshake carrying an Origin (every
    # browser page) is refused.  Clients that send no Origin are not browsers
    # and are not affected.
    websocket_allowed_origins: tuple[str, ...] = ()
    # The only contexts anonymous connections may use, the first their
    # default (comma-separated in the environment, a list in TOML).
    anonymous_contexts: tuple[str, ...] = ("default",)
    admin_token: str | None = None
    log_format: str = "text"
    log_level: str = "info"
    max_event_bytes: int = 1 << 20
    idle_timeout: float = 300.0
    poll_interval: float = 1.0
    commit_timeout: float = 30.0
    max_pending_events: int = 50_000
    # Bytes (bodies, headers, names) queued for the writer before appends
    # answer busy; one append alone is always admitted.
    max_pending_bytes: int = 256 << 20
    # Bytes of fragmented ReactiveSocket/RSocket requests held for all
    # connections of the process together, and for those of one source
    # address (0 = no limit); past either a fragment's stream gets ERROR busy.
    reassembly_budget: int = 256 << 20
    reassembly_budget_per_address: int = 64 << 20
    # Structural limits checked before an append is queued (core.limits).
    max_name_bytes: int = 256
    max_headers: int = 64
    max_header_name_bytes: int = 256
    max_header_value_bytes: int = 4096
    max_body_depth: int = 64
    # Durable subscription / consumer-group names, and how many one context
    # may hold (core.limits.DurableLimits; 0 = no quota).
    max_durable_name_bytes: int = 1024
    max_durable_subscriptions: int = 1000
    # And per principal (user, or the anonymous user), over all its contexts.
    max_durable_subscriptions_per_principal: int = 1000
    # A store read (and a Res01 reader request's storage work) taking longer
    # than this fails with a reader timeout.
    read_timeout: float = 30.0
    # Res01 (ZeroMQ ROUTER): requests served at once; beyond these the server
    # answers "storage writer busy" (4) for AC and "storage reader busy" (10)
    # for RS/FE/PS/SS instead of queueing.
    res01_max_in_flight_writes: int = 4096
    res01_max_in_flight_reads: int = 64
    # An empty one-subscription FE waits this long for a commit (held fetch).
    res01_fetch_wait: float = 0.5
    bson_query_window: int = 100
    # A commit slower than this is logged (warning).
    slow_commit_seconds: float = 1.0
    # Connections one listener accepts at once; more are refused and logged
    # (0 = no limit).  Res01 (ZeroMQ) has no per-connection accept to refuse.
    max_connections: int = 10_000
    # Connections from one source address a listener accepts at once (TCP and
    # WebSocket; 0 = no limit); more are refused like max_connections.
    max_connections_per_address: int = 256
    # A write to a peer that does not read, stuck for this long, closes the
    # connection (0 = no limit).
    write_timeout: float = 30.0
    # A TCP or WebSocket connection that has not completed its protocol's
    # handshake or login this long after it was accepted is closed (0 = no
    # limit): connections that say nothing do not hold a slot for ever.
    handshake_timeout: float = 10.0
    # On SIGTERM/SIGINT: unready and no new connections at once, then up to
    # this long for the appends and reads in flight to finish before the
    # connections close (0 = close at once).  A second signal cuts it short.
    shutdown_grace: float = 10.0
    # A frame (a WebSocket message) a TCP or WebSocket peer has started must
    # be complete this long after its first byte (0 = no limit): the idle
    # timeout, which every byte restarts, governs only the gaps between
    # frames, so a peer trickling a frame a byte at a time is cut here.
    frame_timeout: float = 30.0
    # WebSocket endpoints ping every this many seconds; a peer that does not
    # answer with a pong in time is closed (0 = no pings).
    websocket_heartbeat: float = 30.0
    # /metrics: one lag series per durable subscription (their number is up
    # to the clients); off, only the count and the largest lag are exported.
    metrics_per_subscription: bool = False
    # TLS: defaults for every listener, then per listener ([tls] and
    # [tls.<listener>] in TOML, POLYPORT_TLS_CERT / POLYPORT_BSON_TLS_CERT,
    # --tls-cert / --bson-tls-cert; --bson-tls MODE).
    tls: TlsOptions = TlsOptions()
    bson_tls: TlsOptions = TlsOptions()
    reactivesocket_tls: TlsOptions = TlsOptions()
    rsocket_tls: TlsOptions = TlsOptions()
    micromsg2_tls: TlsOptions = TlsOptions()
    segment_tls: TlsOptions = TlsOptions()
    http_tls: TlsOptions = TlsOptions()
    # Res01: ZeroMQ CURVE on the ROUTER socket (gateway/transports/curve.py).  The server
    # secret key (Z85) is read from this file, or generated into the data
    # directory on first start.
    res01_curve: bool = False
    res01_curve_key_file: str | None = None
    # The asyncio event loop of `serve` (gateway/process/eventloop.py).
    event_loop: str = "auto"
    # Gateway processes (gateway/process/supervisor.py): the byte-stream listeners in
    # every one of them on shared ports (SO_REUSEPORT), Res01 and HTTP in the
    # first.  1 = one process, no supervisor.  "auto" in the file, the
    # environment or the flag = the number of cores this process may use.
    workers: int = 1
    # With workers > 1: one commit chain commits for every worker
    # (core/chain.py), in a process of its own or in the last worker (see
    # COMMIT_CHAINS); off: each worker commits on its own (the head row
    # makes them take turns).
    commit_chain: str = "auto"
    # Commits at positions the gateway's sole writer plans (migration 0011):
    # consecutive commits insert their events in parallel, and only moving
    # the head row and the WAL flush are serialised.  Off: every commit
    # takes the head row first, as gateways before 0011 did.  See
    # PLANNED_POSITIONS.
    planned_positions: str = "auto"
    # Batches each writer keeps in flight: "auto" or 1..MAX_PIPELINE_DEPTH
    # (see pipeline_depth()).
    pipeline_depth: str = "auto"
    # The default policy or SCHED_BATCH for the gateway's processes (see
    # CPU_SCHEDULINGS): with batch, their wake-ups no longer preempt each
    # other; with forwarders, the forwarding workers' no longer preempt.
    cpu_scheduling: str = "normal"
    extra: dict[str, Any] = field(default_factory=dict)

    def port_for(self, listener: str) -> int | None:
        value: int | None = getattr(self, f"{listener}_port")
        return value

    def tls_for(self, listener: str) -> TlsOptions | None:
        """The listener's TLS options over the defaults, or None when it
        serves plain only (no certificate, or mode off)."""
        if listener not in TLS_LISTENERS:
            return None
        own: TlsOptions = getattr(self, f"{listener}_tls")
        merged = own.over(self.tls)
        if not merged.enabled:
            return None
        mode = merged.mode or "required"
        if listener == "http" and own.mode is None and mode == "dual":
            # Dual is for the byte-stream listeners: HTTP under a dual default is HTTPS.
            mode = "required"
        return TlsOptions(
            merged.cert, merged.key, merged.client_ca, merged.min_version or "1.2",
            mode, merged.user_from or "cn",
        )


# Every port setting (http_port, res01_login_port, …).
PORT_KEYS = tuple(f.name for f in fields(GatewayConfig) if f.name.endswith("_port"))
_PORT_KEYS = set(PORT_KEYS)
_TLS_FIELDS = {"tls", *(f"{n}_tls" for n in TLS_LISTENERS)}
_BOOL_KEYS = {"allow_anonymous", "metrics_per_subscription", "res01_curve"}
_INT_KEYS = {
    "max_event_bytes",
    "max_pending_events",
    "max_pending_bytes",
    "reassembly_budget",
    "reassembly_budget_per_address",
    "max_name_bytes",
    "max_headers",
    "max_header_name_bytes",
    "max_header_value_bytes",
    "max_body_depth",
    "max_durable_name_bytes",
    "max_durable_subscriptions",
    "max_durable_subscriptions_per_principal",
    "bson_query_window",
    "res01_max_in_flight_writes",
    "res01_max_in_flight_reads",
    "max_connections",
    "max_connections_per_address",
}
# Settings where 0 has a documented meaning ("no limit", "none", "at once");
# every other number must be positive.  -5 bytes or a 0 s poll interval
# started the gateway without a word before.
_ZERO_ALLOWED = {
    "max_connections", "max_connections_per_address", "websocket_heartbeat", "write_timeout",
    "handshake_timeout", "frame_timeout", "res01_fetch_wait", "shutdown_grace",
    "reassembly_budget", "reassembly_budget_per_address", "max_durable_subscriptions",
    "max_durable_subscriptions_per_principal",
}
_FLOAT_KEYS = {
    "idle_timeout", "poll_interval", "commit_timeout", "read_timeout", "slow_commit_seconds",
    "write_timeout", "handshake_timeout", "frame_timeout", "websocket_heartbeat",
    "res01_fetch_wait", "shutdown_grace",
}
_LIST_KEYS = {"websocket_allowed_origins", "res01_allow_from"}
_KNOWN = {f.name for f in fields(GatewayConfig)} - {"extra"} - _TLS_FIELDS


def tls_keys() -> dict[str, tuple[str, str]]:
    """Flat setting names of the TLS options -> (config field, option):
    ``tls_cert`` -> (tls, cert), ``bson_tls_cert`` -> (bson_tls, cert),
    ``bson_tls`` -> (bson_tls, mode).  Environment variables and flags are
    these names (POLYPORT_TLS_CERT, --bson-tls-cert)."""
    out: dict[str, tuple[str, str]] = {}
    for fld in sorted(_TLS_FIELDS):
        for opt in TLS_OPTIONS:
            out[f"{fld}_{opt}"] = (fld, opt)
        if fld != "tls":
            out[fld] = (fld, "mode")
    return out


_TLS_KEYS = tls_keys()
_TLS_CHOICES = {"mode": TLS_MODES, "min_version": TLS_VERSIONS, "user_from": TLS_USER_FROM}


def _tls_option(option: str, value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, float):  # TOML: min_version = 1.3
        value = f"{value:.1f}"
    text = str(value).strip()
    choices = _TLS_CHOICES.get(option)
    if choices is not None:
        text = text.lower()
        if text not in choices:
            raise ConfigError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return text


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
_CHOICES = {"log_level": LOG_LEVELS, "log_format": LOG_FORMATS, "event_loop": EVENT_LOOPS,
            "cpu_scheduling": CPU_SCHEDULINGS}
DATABASE_SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")


def _check_database_url(value: str, where: str) -> str:
    scheme, sep, _rest = value.partition("://")
    if not sep or scheme.lower() not in DATABASE_SCHEMES:
        # Never echo the URL: it may carry a password.
        shown = f"scheme {scheme!r}" if sep else "a value without a scheme"
        raise ConfigError(
            f"{where}: {shown} is not a PostgreSQL URL; "
            "write postgresql://user:password@host:port/database"
        )
    return value


def _parse_contexts(value: Any, where: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{where}: expected a list of context names, got {value!r}")
    contexts = tuple(dict.fromkeys(i.strip() for i in items if i.strip()))
    if not contexts:
        raise ConfigError(
            f"{where}: anonymous access needs at least one context "
            "(turn it off with allow_anonymous = false instead)"
        )
    return contexts


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _parse_workers(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return available_cores()
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a number of processes or 'auto', got {value!r}")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}: expected a number of processes or 'auto', got {value!r}"
        ) from None
    if not 1 <= n <= MAX_WORKERS:
        raise ConfigError(f"{where}: workers must be 1..{MAX_WORKERS} or 'auto', got {value!r}")
    return n


def _parse_number(key: str, value: Any, where: str) -> int | float:
    number: int | float
    try:
        number = int(value) if key in _INT_KEYS else float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if isinstance(number, float) and not math.isfinite(number):  # NaN, inf
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if key in _ZERO_ALLOWED:
        if number < 0:
            raise ConfigError(f"{where}: must be 0 (none) or more, got {value!r}")
    elif number <= 0:
        raise ConfigError(f"{where}: must be more than 0, got {value!r}")
    return number


def coerce(key: str, value: Any, where: str | None = None) -> Any:
    """``value`` as the type of setting ``key``; errors name ``where`` the value
    came from (a flag, an environment variable, a file key), else ``key``."""
    where = where or key
    if key in _PORT_KEYS:
        return parse_port(value, where)
    if key in _BOOL_KEYS:
        return _parse_bool(value, where)
    if key == "commit_chain":
        # true and false (the setting's first spelling) still mean auto and off.
        return _parse_choice(value, where, COMMIT_CHAINS, "auto")
    if key == "planned_positions":
        return _parse_choice(value, where, PLANNED_POSITIONS, "on")
    if key == "pipeline_depth":
        return _parse_pipeline_depth(value, where)
    if key == "res01_allow_from":
        return _parse_networks(value, where)
    if key in _LIST_KEYS:
        return _parse_list(value, where)
    if key == "workers":
        return _parse_workers(value, where)
    if key in _INT_KEYS or key in _FLOAT_KEYS:
        return _parse_number(key, value, where)
    if key in _CHOICES and value is not None:
        text = str(value).strip().lower()
        if text not in _CHOICES[key]:
            raise ConfigError(
                f"{where}: expected one of {', '.join(_CHOICES[key])}, got {value!r}"
            )
        return text
    if key == "database_url" and value:
        return _check_database_url(str(value), where)
    if key == "anonymous_contexts":
        return _parse_contexts(value, where)
    return value if value is None else str(value)


def load_config(
    config_file: str | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> GatewayConfig:
    values: dict[str, Any] = {}
    # TLS options by config field, merged in the same order (file < env < flags).
    tls: dict[str, dict[str, str | None]] = {}
    env = dict(os.environ if env is None else env)
    config_file = config_file or env.get("POLYPORT_CONFIG")
    if config_file:
        _from_file(Path(config_file), values, tls)
    _from_env(env, values, tls)
    _from_overrides(overrides or {}, values, tls)
    for fld, options in tls.items():
        values[fld] = replace(TlsOptions(), **options)
    return replace(GatewayConfig(), **values)


def _from_file(
    path: Path, values: dict[str, Any], tls: dict[str, dict[str, str | None]]
) -> None:
    """The config file's settings into ``values`` and ``tls``."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    data = data.get("polyport", data)
    if any(key.replace("-", "_") == "admin_token" for key in data):
        check_private_file(path, "admin_token: config file",
                           " or set POLYPORT_ADMIN_TOKEN instead")
    for key, value in data.items():
        k = key.replace("-", "_")
        if k == "tls" and isinstance(value, dict):
            _tls_table(value, tls, path)
            continue
        if k in _TLS_KEYS:
            fld, opt = _TLS_KEYS[k]
            tls.setdefault(fld, {})[opt] = _tls_option(opt, value, f"{path}: {key}")
            continue
        if k not in _KNOWN:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        values[k] = coerce(k, value, f"{path}: {key}")


def _from_env(
    env: dict[str, str], values: dict[str, Any], tls: dict[str, dict[str, str | None]]
) -> None:
    """The ``POLYPORT_*`` environment variables over the file's settings."""
    for key in _KNOWN:
        env_key = f"POLYPORT_{key.upper()}"
        if env_key in env:
            values[key] = coerce(key, env[env_key], env_key)
    for key, (fld, opt) in _TLS_KEYS.items():
        env_key = f"POLYPORT_{key.upper()}"
        if env_key in env:
            tls.setdefault(fld, {})[opt] = _tls_option(opt, env[env_key], env_key)


def _from_overrides(
    overrides: dict[str, Any], values: dict[str, Any], tls: dict[str, dict[str, str | None]]
) -> None:
    """The command line's flags over everything else (``None``: not given)."""
    for key, value in overrides.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key in _TLS_KEYS:
            fld, opt = _TLS_KEYS[key]
            tls.setdefault(fld, {})[opt] = _tls_option(opt, value, flag)
        else:
            values[key] = coerce(key, value, flag)


def _tls_table(table: dict[str, Any], out: dict[str, dict[str, str | None]], path: Path) -> None:
    """``[tls]``: options for every listener; ``[tls.<listener>]``: one listener's."""
    for key, value in table.items():
        k = key.replace("-", "_")
        if k in TLS_LISTENERS and isinstance(value, dict):
            for opt_key, opt_value in value.items():
                opt = opt_key.replace("-", "_")
                if opt not in TLS_OPTIONS:
                    raise ConfigError(f"config file {path}: unknown key tls.{key}.{opt_key!s}")
                out.setdefault(f"{k}_tls", {})[opt] = _tls_option(
                    opt, opt_value, f"{path}: tls.{key}.{opt_key}"
                )
        elif k in TLS_OPTIONS:
            out.setdefault("tls", {})[k] = _tls_option(k, value, f"{path}: tls.{key}")
        else:
            raise ConfigError(f"config file {path}: unknown key tls.{key}")


# --- from the command line ---------------------------------------------------------
# Here rather than in gateway/cli/: the supervisor rereads the configuration
# on SIGHUP, and the CLI imports the supervisor.

_NOT_SETTINGS = ("command", "action", "config", "revision", "debug", "new_password")


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    overrides = {
        k: v
        for k, v in vars(args).items()
        if k not in _NOT_SETTINGS and v is not None
    }
    url_file = overrides.pop("database_url_file", None)
    if url_file is not None:
        if "database_url" in overrides:
            raise ConfigError("--database-url and --database-url-file: give one of them")
        overrides["database_url"] = _read_url_file(Path(url_file))
    known = set(GatewayConfig.__dataclass_fields__) | set(tls_keys())
    return load_config(getattr(args, "config", None),
                       overrides={k: v for k, v in overrides.items() if k in known})


def _read_url_file(path: Path) -> str:
    try:
        lines = path.read_text().strip().splitlines()
    except OSError as exc:
        raise ConfigError(f"--database-url-file: cannot read {path}: {exc.strerror}") from None
    url = lines[0].strip() if lines else ""
    if not url:
        raise ConfigError(f"--database-url-file: {path} is empty; write the URL on its first line")
    if urlsplit(url).password:
        check_private_file(path, "--database-url-file:")
    return url
