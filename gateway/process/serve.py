"""``polyport serve`` in one process (a worker runs the same): start the
gateway, announce it, stop gracefully on SIGTERM/SIGINT (a second one cuts
the grace short), and reread the configuration on SIGHUP."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from polyport.gateway.config import TLS_LISTENERS, GatewayConfig, config_from_args
from polyport.gateway.process.announce import Announcement, announce, notify_systemd
from polyport.gateway.process.eventloop import LoopChoice
from polyport.gateway.process.fatal import describe
from polyport.gateway.process.logging_setup import setup_logging
from polyport.gateway.process.ports_file import remove_ports_file, write_ports_file

log = logging.getLogger("polyport")


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
    except Exception as exc:  # noqa: BLE001 - a reload never stops the process
        log.error("reload refused, nothing changed: %s", describe(exc))
        return
    old = gw.config
    try:
        reloaded = gw.reload_tls(new)
    except Exception as exc:  # noqa: BLE001 - a reload never stops the process
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
