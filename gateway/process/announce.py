"""What ``serve`` tells its operator and its service manager once it is up:
each listener once, then one ``ready`` line with the status page and whether
the admin API is on; with systemd, ``READY=1`` on ``$NOTIFY_SOCKET``.

Text logs: the lines go to stdout as ``polyport: …`` (scripts and tests wait
for them there).  JSON logs: they are log records like every other line, on
the log's stream, so a collector sees one stream of JSON."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

log = logging.getLogger("polyport.gateway")


@dataclass(frozen=True)
class Announcement:
    listeners: dict[str, tuple[str, int]]
    http: tuple[str, int] | None
    https: bool
    curve_public_key: str | None
    admin_api: bool

    def lines(self) -> list[str]:
        out = [f"{name} listening on {host}:{port}"
               for name, (host, port) in self.listeners.items()]
        if self.http is not None:
            out.append(f"http listening on {self.http[0]}:{self.http[1]}"
                       f"{' (https)' if self.https else ''}")
        if self.curve_public_key:
            out.append(f"res01 CURVE server public key {self.curve_public_key}")
        out.append(self.ready_line())
        return out

    def ready_line(self) -> str:
        admin = "admin API on" if self.admin_api else "admin API off (no admin_token)"
        if self.http is None:
            return f"ready: no HTTP port, so no status page; {admin}"
        host = self.http[0]
        host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.https else "http"
        return f"ready: status page {scheme}://{host}:{self.http[1]}/, {admin}"


def announce(what: Announcement, log_format: str) -> None:
    for line in what.lines():
        if log_format == "json":
            log.info("%s", line)
        else:
            print(f"polyport: {line}", flush=True)
    notify_systemd(f"READY=1\nSTATUS={what.ready_line()}\nMAINPID={os.getpid()}")


def notify_systemd(state: str) -> bool:
    """Send ``state`` to the service manager (sd_notify(3)); False when not
    run under one.  Never raises: a service manager that went away must not
    stop the gateway."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("could not notify the service manager at %s: %s", address, exc)
        return False
    return True
