"""The gateway process: store, protocol listeners and the HTTP port."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from aiohttp import web

from polyport.core import migrate
from polyport.core.commands import Principal
from polyport.core.groups import GroupMember
from polyport.core.limits import DurableLimits, EventLimits
from polyport.core.migrate import asyncpg_dsn
from polyport.core.store import EventStore, StoreConfig
from polyport.core.subscriptions import Subscription
from polyport.core.users import UserChanges
from polyport.core.writer import WriterLimits
from polyport.gateway.config import (
    TLS_LISTENERS,
    ConfigError,
    GatewayConfig,
    pipeline_depth,
    planned_positions,
)
from polyport.gateway.http import chart_history
from polyport.gateway.http.server import build_app
from polyport.gateway.http.telemetry import Telemetry
from polyport.gateway.process.database import database, supervise_embedded
from polyport.gateway.process.fatal import naming_bind_errors
from polyport.gateway.process.rights import recheck
from polyport.gateway.process.workers import (
    Aggregator,
    WorkerRole,
    WorkerServer,
    chain_connector,
    listen_for_workers,
)
from polyport.gateway.registry import ListenerDef, RunningListener, discover
from polyport.gateway.transports.tls import ServerTls, check_material
from polyport.gateway.transports.websocket import TLS_USER_FROM
from polyport.protocols.budgets import BudgetAccount, ByteBudget
from polyport.protocols.connections import ConnectionTable
from polyport.protocols.session import CURRENT_PEER, ListenerStats, SessionContext

log = logging.getLogger("polyport.gateway")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (a name other than
    ``localhost`` is taken as reachable from elsewhere)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_anonymous_exposed(config: GatewayConfig) -> None:
    """Anonymous access is on by default because every listener binds
    127.0.0.1; bound elsewhere, anyone who reaches the port may use the
    anonymous contexts."""
    if config.allow_anonymous and not is_loopback(config.host):
        log.warning(
            "listening on %s with anonymous access on: anyone who reaches these ports may "
            "read and write the anonymous contexts; set allow_anonymous = false "
            "(POLYPORT_ALLOW_ANONYMOUS=false) and add users with 'polyport users add'",
            config.host,
        )


def writer_limits(config: GatewayConfig, sole: bool = True,
                  dedicated: bool = False) -> WriterLimits:
    """The writer's bounds from the configuration (a gateway's own writer,
    or the commit chain's).  ``sole``: the gateway's only writer in normal
    operation (one process, or the commit chain's); the others -- each
    worker's with commit_chain off, a chain-fed worker's own for when the
    chain is away -- take turns with other writers, and commits at planned
    positions would collide with theirs (core/writer.py, _head_moved).
    ``dedicated``: the writer of a commit chain process, which has nothing
    else to do (see config.pipeline_depth)."""
    return WriterLimits(
        planned_positions=planned_positions(config) and sole,
        pipeline_depth=pipeline_depth(config, dedicated=dedicated),
        commit_timeout=config.commit_timeout,
        max_pending_events=config.max_pending_events,
        max_pending_bytes=config.max_pending_bytes,
        max_event_bytes=config.max_event_bytes,
        slow_commit_seconds=config.slow_commit_seconds,
        events=EventLimits(
            max_name_bytes=config.max_name_bytes,
            max_headers=config.max_headers,
            max_header_name_bytes=config.max_header_name_bytes,
            max_header_value_bytes=config.max_header_value_bytes,
            max_body_depth=config.max_body_depth,
        ),
    )


class Gateway:
    """Start with :meth:`start`, stop with :meth:`stop` (or ``async with``)."""

    def __init__(self, config: GatewayConfig, role: WorkerRole | None = None) -> None:
        """``role``: one worker of several (gateway/process/supervisor.py), with
        ``config`` already as that worker runs it (:meth:`WorkerRole.apply`)."""
        self.config = config
        self.role = role
        # The first worker's view of every worker (/metrics, /status).
        self.aggregator: Aggregator | None = None
        self._worker_server: WorkerServer | None = None
        self._chain_server: asyncio.AbstractServer | None = None
        self.store: EventStore = None  # type: ignore[assignment]
        self.database_url = ""
        self.listeners: dict[str, RunningListener] = {}
        self.listener_defs: list[ListenerDef] = []
        self.http_address: tuple[str, int] | None = None
        self.listeners_bound = False
        # Stopping: unready, no new connections (drain).
        self.draining = False
        self.started_at = time.time()
        self.telemetry: Telemetry | None = None
        # Every transport's open connections (GET /admin/connections).
        self.connections = ConnectionTable(
            *((role.index, role.count) if role is not None else (0, 1))
        )
        self._user_changes: UserChanges | None = None
        self._exit = ExitStack()
        self._embedded_watch: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        # Listener name -> its TLS context (the HTTP port is "http").
        self.tls: dict[str, ServerTls] = {}
        # Requests clients have begun and not finished, every connection
        # together: ReactiveSocket/RSocket fragments (gateway/transports/reactive.py) and
        # the frames not yet whole of the byte-stream protocols.
        self.reassembly_budget = ByteBudget(
            config.reassembly_budget,
            config.reassembly_budget_per_address,
            what="unfinished requests",
            setting="reassembly_budget",
            per_address_setting="reassembly_budget_per_address",
        )

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def readiness_problems(self) -> list[str]:
        """Why the gateway is not ready (empty: ready), from what the store
        keeps current (core.health): ``/readyz`` and the ``polyport_ready``
        gauge ask here, and neither costs a database round trip."""
        problems = self.store.health().problems
        if self.draining:
            problems.append("shutting down: draining, no new connections")
        elif not self.listeners_bound:
            problems.append("listeners not bound yet")
        return problems

    async def drain(self, grace: float, hurry: asyncio.Event | None = None) -> None:
        """The first step of a stop (lame duck): unready and accepting no new
        connection at once, then up to ``grace`` seconds (or until ``hurry``)
        for the appends and reads in flight to be answered.  Open connections
        are still served meanwhile; :meth:`stop` closes them."""
        self.draining = True
        for listener in self.listeners.values():
            await listener.stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        busy = self._in_flight()
        if busy:
            log.info("draining: %d appends and reads in flight; waiting up to %.0f s", busy, grace)
        while busy and loop.time() < deadline and not (hurry is not None and hurry.is_set()):
            await asyncio.sleep(0.05)
            busy = self._in_flight()
        if busy:
            log.warning("drain ended with %d appends and reads still in flight; their "
                        "connections close now (clients retry with the same event ids)", busy)

    def _in_flight(self) -> int:
        if self.store is None or not self.store.started:
            return 0
        return self.store.writer.appends_in_flight + self.store.reads_waiting

    def context(self, protocol: str, stats: ListenerStats) -> SessionContext:
        # Every listener asks for its context before it accepts: the one
        # place to hand each transport the connection limit.
        stats.max_connections = self.config.max_connections or None
        stats.max_connections_per_address = self.config.max_connections_per_address or None
        stats.write_timeout = self.config.write_timeout or None
        stats.handshake_timeout = self.config.handshake_timeout or None
        stats.frame_timeout = self.config.frame_timeout or None
        stats.websocket_heartbeat = self.config.websocket_heartbeat or None
        stats.reuse_port = self.role is not None
        stats.connections = self.connections
        return SessionContext(
            self.store,
            stats=stats,
            settings=self.settings,
            log=logging.getLogger(f"polyport.{protocol}"),
        )

    def budget_account(self) -> BudgetAccount:
        """A new connection's account in :attr:`reassembly_budget`, by its
        source host; call it where the transport has set CURRENT_PEER (in
        the session factory)."""
        peer = CURRENT_PEER.get()
        return self.reassembly_budget.account(peer.login_source if peer is not None else "-")

    def server_tls(self, listener: str) -> ServerTls | None:
        """The listener's TLS (built, checked and kept for :meth:`reload_tls`),
        or None when it serves plain only."""
        options = self.config.tls_for(listener)
        if options is None:
            return None
        if listener == "http" and options.mode == "dual":
            raise ConfigError("http: TLS mode dual is for the TCP listeners; HTTP is "
                              "required or off (set http_tls to required or off)")
        tls = ServerTls(listener, options)
        self.tls[listener] = tls
        return tls

    def reload_tls(self, config: GatewayConfig) -> list[str]:
        """Load the certificates and keys ``config`` names into the running
        listeners: new connections get them, open ones keep theirs.  Returns
        the listeners reloaded; ConfigError (nothing changed for that
        listener and the ones after it) when new material is refused."""
        done = []
        for name, tls in self.tls.items():
            options = config.tls_for(name)
            if options is None:
                continue  # turning TLS off needs a restart
            tls.reload(options)
            done.append(name)
        return done

    @property
    def settings(self) -> dict[str, Any]:
        c = self.config
        return {
            "max_event_bytes": c.max_event_bytes,
            "idle_timeout": c.idle_timeout,
            "bson_query_window": c.bson_query_window,
            "read_timeout": c.read_timeout,
            "res01_max_in_flight_writes": c.res01_max_in_flight_writes,
            "res01_max_in_flight_reads": c.res01_max_in_flight_reads,
            "res01_fetch_wait": c.res01_fetch_wait,
            **c.extra,
        }

    async def start(self) -> None:
        # Bad TLS material stops the start before anything else is done.
        for name in TLS_LISTENERS:
            options = self.config.tls_for(name)
            if options is not None:
                check_material(name, options)
        if self.role is None or self.role.first:  # once, not once per worker
            warn_if_anonymous_exposed(self.config)
        loop = asyncio.get_running_loop()
        url, pg = await loop.run_in_executor(
            None, lambda: self._exit.enter_context(database(self.config))
        )
        embedded = pg is not None
        self.database_url = url
        if pg is not None:
            self._embedded_watch = asyncio.create_task(
                supervise_embedded(pg), name="polyport-embedded-pg")
        try:
            if embedded:
                await migrate.upgrade_in_thread(url)
            else:
                await migrate.check_current(url)
            self.store = EventStore(self._store_config(url))
            await self.store.start()
            # Open connections follow their users' rights (gateway/process/rights.py),
            # whichever process changed them.
            self._user_changes = UserChanges(
                asyncpg_dsn(url), self._rights_changed, logging.getLogger("polyport.rights")
            )
            self._user_changes.start()
            self.telemetry = Telemetry(self)
            if self.role is None or self.role.first:  # one process keeps the charts
                self.telemetry.keep_history(
                    Path(self.config.data_dir) / chart_history.FILE_NAME)
            self.telemetry.start()
            self._count_per_connection()
            await self._start_listeners()
            if self.config.http_port is not None:
                await self._start_http(self.config.http_port)
            if self.store.chain is not None and self.role is not None:
                self._chain_server = await listen_for_workers(self.store.chain.protocol,
                                                              self.role.run_dir)
            if self.role is not None:
                self._worker_server = WorkerServer(self, self.role)
                await self._worker_server.start()
                if self.role.first:
                    self.aggregator = Aggregator(self, self.role)
            self.listeners_bound = True
        except BaseException:
            await self.stop()
            raise

    def _store_config(self, url: str) -> StoreConfig:
        return StoreConfig(
            url,
            poll_interval=self.config.poll_interval,
            allow_anonymous=self.config.allow_anonymous,
            anonymous_contexts=self.config.anonymous_contexts,
            read_timeout=self.config.read_timeout,
            writer=writer_limits(self.config,
                                 sole=self.role is None or self.role.hosts_chain),
            chain=None if self.role is None or not self.role.chain or self.role.hosts_chain
            else chain_connector(self.role.run_dir),
            hosts_chain=self.role is not None and self.role.hosts_chain,
            notify_group=None if self.role is None else self.role.store_notify_group,
            # The hosting worker's own writer counts a hosted chain's commits.
            chain_counts_commits=self.role is None or (
                self.role.first and not self.role.chain_in_worker),
            application_name=migrate.GATEWAY_APPLICATION_NAME,
            durable=DurableLimits(
                max_name_bytes=self.config.max_durable_name_bytes,
                max_per_context=self.config.max_durable_subscriptions,
                max_per_principal=self.config.max_durable_subscriptions_per_principal,
            ),
        )

    async def _start_listeners(self) -> None:
        """Every discovered listener whose port is not off."""
        self.listener_defs = discover()
        for d in self.listener_defs:
            port = self.config.port_for(d.name)
            if port is None:
                continue
            with naming_bind_errors(d.name, self.config.host, port):
                listener = await d.start(self, self.config.host, port)
            self.listeners[d.name] = listener

    async def _start_http(self, port: int) -> None:
        """The HTTP port, with the routes the listeners add (WebSocket endpoints)."""
        app = build_app(self)
        http_tls = self.server_tls("http")
        if http_tls is not None:
            app[TLS_USER_FROM] = http_tls.user_from
        for d in self.listener_defs:
            if d.http_setup is not None:
                d.http_setup(self, app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # aiohttp takes the context as is: HTTPS only (dual mode is
        # for the byte-stream listeners).
        site = web.TCPSite(
            self._runner, self.config.host, port,
            ssl_context=http_tls.context if http_tls is not None else None,
            # A worker binds beside the supervisor's reservation of the port.
            reuse_port=True if self.role is not None else None,
        )
        with naming_bind_errors("http", self.config.host, port):
            await site.start()
        server = site._server
        assert server is not None
        sock = server.sockets[0].getsockname()  # type: ignore[attr-defined]
        self.http_address = (sock[0], sock[1])

    async def _rights_changed(self, user: str | None) -> None:
        await recheck(self.connections, self.store.users, user)

    def _count_per_connection(self) -> None:
        """Store hooks that credit the connection the calling task serves
        (deliveries are counted by the telemetry's delivery hook)."""

        def appended(events: int) -> None:
            peer = CURRENT_PEER.get()
            if peer is not None and peer.connection is not None:
                peer.connection.events_in += events

        def logged_in(principal: Principal) -> None:
            peer = CURRENT_PEER.get()
            if peer is not None and peer.connection is not None:
                peer.connection.user = principal.user

        def subscribed(sub: Subscription | GroupMember) -> None:
            peer = CURRENT_PEER.get()
            if peer is not None and peer.connection is not None:
                peer.connection.subscriptions.add(sub)

        self.store.on_append = appended
        self.store.on_login = logged_in
        self.store.on_subscribe = subscribed

    async def stop(self) -> None:
        """Stop accepting, drain the writer, close connections, stop the database."""
        self.listeners_bound = False
        if self._worker_server is not None:
            await self._worker_server.stop()
            self._worker_server = None
        for listener in self.listeners.values():
            await listener.stop_accepting()
        if self._user_changes is not None:
            await self._user_changes.stop()
            self._user_changes = None
        if self.telemetry is not None:
            await self.telemetry.stop()
        if self._chain_server is not None:
            self._chain_server.close()
            self._chain_server = None
            if self.store is not None and self.store.chain is not None:
                # Stopping with the others (SIGTERM reaches every worker),
                # they drain through this chain and leave; one still here
                # after the grace commits on its own from here (units this
                # writer holds commit below; re-sent ones are idempotent).
                await self.store.chain.peers_gone(self.config.shutdown_grace)
                self.store.chain.disconnect()
        if self.store is not None:
            await self.store.close()
        for listener in self.listeners.values():
            await listener.close()
        self.listeners.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._embedded_watch is not None:
            self._embedded_watch.cancel()
            self._embedded_watch = None
        await asyncio.get_running_loop().run_in_executor(None, self._exit.close)
