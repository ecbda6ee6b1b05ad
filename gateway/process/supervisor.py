"""``polyport serve --workers N``: the supervisor of N gateway processes.

What runs where:

- the supervisor (this process) checks the configuration, starts the
  embedded PostgreSQL when there is no database URL and migrates it, once;
  picks the concrete port of every listener set to 0, writes the ports file,
  prints the listening lines, and watches the workers;
- every worker (gateway/process/worker.py) is a whole gateway with its own store,
  writer and tailer; the byte-stream TCP listeners run in each, bound to the
  same ports with SO_REUSEPORT, so the kernel spreads connections over them.
  The core already coordinates processes (the head row orders commits,
  NOTIFY wakes other tailers, advisory locks give a consumer group one owner);
- worker 0 also runs Res01 (a ZeroMQ ROUTER cannot share a port) and the
  HTTP port, whose /metrics and /status ask every worker (gateway/process/workers.py).

Ports: for each TCP port the supervisor binds a socket with SO_REUSEPORT and
keeps it (bound, never listening: it gets no connections) for as long as it
runs, so a port picked for 0 stays the gateway's while a worker restarts.  A
fixed port is first probed without SO_REUSEPORT: a port another program
listens on is refused rather than shared.  Res01's ports cannot be held that
way (libzmq binds without SO_REUSEPORT): for 0, worker 0 picks one as it
binds, says which, and its restarts get that port.

Workers get their configuration (database URL included) through an inherited
pipe, never argv; the supervisor keeps its end open, so a worker whose
supervisor is gone sees EOF and stops.  SIGTERM or SIGINT: every worker
drains as a single gateway does, then the supervisor exits 0.  SIGHUP is
forwarded (each worker reloads).  A worker that dies is logged in one line and
started again after a backoff that doubles while it keeps dying young.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polyport.core import migrate
from polyport.core.notify import new_notify_group
from polyport.gateway.config import PORT_KEYS, TLS_LISTENERS, GatewayConfig, available_cores
from polyport.gateway.process.announce import Announcement, announce, notify_systemd
from polyport.gateway.process.database import database, supervise_embedded
from polyport.gateway.process.eventloop import choose_loop
from polyport.gateway.process.fatal import naming_bind_errors
from polyport.gateway.process.ports_file import remove_ports_file, write_ports
from polyport.gateway.process.workers import (
    CHAIN_INDEX,
    STATE_FILE,
    WorkerRole,
    chain_socket_path,
    socket_path,
)
from polyport.gateway.registry import discover
from polyport.gateway.transports.tls import check_material

log = logging.getLogger("polyport.supervisor")

# Restart backoff: the first restart after RESTART_DELAY, doubling for each
# crash of a worker that had run less than STABLE_AFTER, up to RESTART_DELAY_MAX.
RESTART_DELAY = 0.5
RESTART_DELAY_MAX = 30.0
STABLE_AFTER = 30.0
# A worker that has not said it is ready by then is taken as failed.
READY_TIMEOUT = 120.0
# Unix socket paths are limited to 108 bytes; longer run directories move to /tmp.
MAX_SOCKET_PATH = 100
_LENGTH = struct.Struct(">Q")
# How a worker ends when it is told to stop (killed by the signal itself when
# it came before the worker's handlers were in place).
_STOPPED = (0, -signal.SIGTERM, -signal.SIGINT)


def supervise(config: GatewayConfig, args: argparse.Namespace) -> int:
    # The supervisor's own work is small: the standard loop is enough.
    return asyncio.run(Supervisor(config, args).run())


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def chain_mode(config: GatewayConfig, cpus: int | None = None) -> str:
    """Where the commit chain runs: ``process``, ``worker`` or ``off``.

    ``auto`` gives the chain a process of its own only when the machine has
    a core to spare beside the workers: a third busy process on two cores
    paid in wake-ups and context switches (W1, two workers: 1.41-1.43x one
    worker's CPU per event with a chain process, 1.31-1.37x with the chain
    in a worker; docs/performance.md, session 11)."""
    mode = config.commit_chain
    if config.workers <= 1 or mode == "off":
        return "off"
    if mode == "auto":
        cpus = available_cores() if cpus is None else cpus
        return "process" if cpus > config.workers else "worker"
    return mode


def restart_delay(quick_failures: int) -> float:
    """Seconds before a restart, after ``quick_failures`` crashes in a row of
    a worker that had not run STABLE_AFTER (the current one included)."""
    return float(min(RESTART_DELAY_MAX, RESTART_DELAY * 2 ** max(0, quick_failures - 1)))


# --- ports -------------------------------------------------------------------------------


def _addresses(host: str, port: int) -> list[tuple[int, Any]]:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    seen: list[tuple[int, Any]] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if (family, sockaddr) not in seen:
            seen.append((family, sockaddr))
    return seen


def _socket(family: int, *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


def probe_port(host: str, port: int) -> int:
    """Bind ``port`` (0: any free one) without SO_REUSEPORT and let it go:
    fails when a program listens there (even one that shares its port), and
    returns the port number."""
    family, sockaddr = _addresses(host, port)[0]
    with _socket(family, reuse_port=False) as sock:
        sock.bind(sockaddr)
        bound: int = sock.getsockname()[1]
        return bound


def reserve_port(host: str, port: int) -> tuple[int, list[socket.socket]]:
    """The port (0: a free one) bound with SO_REUSEPORT on every address of
    ``host``, held by the returned sockets; workers bind it beside them."""
    port = probe_port(host, port)
    held: list[socket.socket] = []
    try:
        for family, sockaddr in _addresses(host, port):
            sock = _socket(family, reuse_port=True)
            held.append(sock)
            sock.bind(sockaddr)
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return port, held


# --- the supervisor ------------------------------------------------------------------------


WORKER_MODULE = "polyport.gateway.process.worker"
CHAIN_MODULE = "polyport.gateway.process.chain"


@dataclass
class _Slot:
    index: int  # CHAIN_INDEX: the commit chain
    module: str = WORKER_MODULE
    proc: asyncio.subprocess.Process | None = None
    pid: int | None = None
    restarts: int = 0
    last_exit: str | None = None
    ready: bool = False
    task: asyncio.Task[None] | None = None
    # It ended badly after the stop began (not by the signal, not with 0).
    failed_stopping: bool = False

    @property
    def name(self) -> str:
        return "the commit chain" if self.module == CHAIN_MODULE else f"worker {self.index}"

    @property
    def is_worker(self) -> bool:
        return self.module == WORKER_MODULE


@dataclass
class Supervisor:
    config: GatewayConfig
    args: argparse.Namespace
    started_at: float = field(default_factory=time.time)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    slots: list[_Slot] = field(default_factory=list)
    _held: list[socket.socket] = field(default_factory=list)
    _role: WorkerRole | None = None
    _run_dir: Path | None = None
    _failed: str | None = None
    # Done when every worker is ready for the first time, or one failed first.
    _initial: asyncio.Future[None] | None = None
    # Worker 0's ready message: its listeners' addresses.
    _first_ready: dict[str, Any] | None = None

    async def run(self) -> int:
        config = self.config
        choice = choose_loop(config.event_loop)  # an impossible choice fails here, once
        for name in TLS_LISTENERS:  # bad TLS material too, before any worker starts
            options = config.tls_for(name)
            if options is not None:
                check_material(name, options)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._hup)
        stack = ExitStack()
        ports_file: Path | None = None
        watch: asyncio.Task[None] | None = None
        try:
            url, pg = await loop.run_in_executor(
                None, lambda: stack.enter_context(database(config)))
            embedded = pg is not None
            if pg is not None:
                watch = asyncio.create_task(supervise_embedded(pg), name="polyport-embedded-pg")
            if embedded:
                await migrate.upgrade_in_thread(url)
            else:
                await migrate.check_current(url)
            ports = self._reserve_ports()
            self._run_dir = self._make_run_dir()
            mode = chain_mode(config)
            self._role = WorkerRole(
                index=0, count=config.workers, run_dir=str(self._run_dir), database_url=url,
                ports=ports, shared=frozenset(d.name for d in discover() if d.per_worker),
                supervisor_pid=os.getpid(), chain=mode != "off", chain_in_worker=mode == "worker",
                notify_group=new_notify_group(),
            )
            if self.stopping.is_set():  # a signal while the database started
                return 0
            self._start_slots(mode, choice.describe())
            await self._wait_initial()
            if self._failed is not None:
                log.error("%s; stopping", self._failed)
                await self._stop_workers()
                return 1
            if self.stopping.is_set():
                await self._stop_workers()
                return 0
            assert self._first_ready is not None
            ports_file = self._announce(self._first_ready)
            await self.stopping.wait()
            notify_systemd("STOPPING=1")
            log.info("shutting down: every worker drains")
            return await self._stop_workers()
        finally:
            remove_ports_file(ports_file)
            for sock in self._held:
                sock.close()
            if self._run_dir is not None:
                shutil.rmtree(self._run_dir, ignore_errors=True)
            if watch is not None:  # before the cluster stops, or it would restart it
                watch.cancel()
            await loop.run_in_executor(None, stack.close)

    # --- start-up -------------------------------------------------------------------

    def _start_slots(self, chain: str, event_loop: str) -> None:
        workers = self.config.workers
        log.info("starting %d workers%s (event loop %s, CPU scheduling %s)", workers,
                 {"process": " and the commit chain process",
                  "worker": f", worker {workers - 1} hosting the commit chain"}.get(chain, ""),
                 event_loop, self.config.cpu_scheduling)
        self.slots = [_Slot(i) for i in range(workers)]
        if chain == "process":
            self.slots.insert(0, _Slot(CHAIN_INDEX, CHAIN_MODULE))
        self._initial = asyncio.get_running_loop().create_future()
        for slot in self.slots:
            slot.task = asyncio.create_task(self._keep_running(slot))

    def _reserve_ports(self) -> dict[str, int]:
        """Setting -> concrete port; TCP ports are held (SO_REUSEPORT).  The
        ports of worker-0-only listeners that are 0 are left out: worker 0
        picks them when it binds, and says which (see :meth:`_ready`)."""
        config = self.config
        shared = {f"{d.name}_port" for d in discover() if d.per_worker} | {"http_port"}
        ports: dict[str, int] = {}
        for key in PORT_KEYS:
            value = getattr(config, key)
            if value is None:
                continue
            name = key.removesuffix("_port")
            if key not in shared:
                continue  # worker 0 binds it; a failure stops the start
            with naming_bind_errors(name, config.host, value):
                port, held = reserve_port(config.host, value)
                self._held.extend(held)
            ports[key] = port
        return ports

    def _make_run_dir(self) -> Path:
        """A private directory for the workers' sockets and the state file."""
        base = Path(self.config.data_dir) / "workers"
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        for old in base.iterdir():  # of supervisors that are gone
            if old.name.isdigit() and not _alive(int(old.name)):
                shutil.rmtree(old, ignore_errors=True)
        run_dir = base / str(os.getpid())
        longest = max(len(str(path)) for path in (
            socket_path(str(run_dir.resolve()), self.config.workers),
            chain_socket_path(str(run_dir.resolve()))))
        if longest > MAX_SOCKET_PATH:
            return Path(tempfile.mkdtemp(prefix="polyport-workers-"))
        run_dir.mkdir(mode=0o700, exist_ok=True)
        run_dir.chmod(0o700)
        return run_dir.resolve()

    async def _wait_initial(self) -> None:
        assert self._initial is not None
        stop: asyncio.Future[Any] = asyncio.ensure_future(self.stopping.wait())
        initial: asyncio.Future[Any] = self._initial
        try:
            await asyncio.wait({initial, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()

    def _announce(self, ready: dict[str, Any]) -> Path | None:
        listeners = {name: (host, port) for name, (host, port) in ready["listeners"].items()}
        http = (str(ready["http"][0]), int(ready["http"][1])) if ready.get("http") else None
        # Written before the lines below: whoever waits for them can read it.
        path = write_ports(self.config.data_dir, self.started_at, listeners,
                           http, workers=self.config.workers)
        log.info("%d workers ready", self.config.workers)
        announce(Announcement(
            listeners=listeners, http=http, https=bool(ready.get("https")),
            curve_public_key=ready.get("curve"), admin_api=bool(self.config.admin_token)),
            self.config.log_format)
        return path

    # --- one worker ----------------------------------------------------------------------

    async def _keep_running(self, slot: _Slot) -> None:
        quick_failures = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            returncode = await self._run_once(slot)
            if returncode is None:  # stopped by request
                return
            slot.last_exit = describe_exit(returncode)
            self._write_state()
            if self.stopping.is_set():
                slot.failed_stopping = True
                return
            if self._initial is not None and not self._initial.done():
                self._failed = (f"{slot.name} (pid {slot.pid}) {slot.last_exit} "
                                "while the workers were starting")
                self._initial.set_result(None)
                return
            quick_failures = 0 if time.monotonic() - started >= STABLE_AFTER else (
                quick_failures + 1)
            delay = restart_delay(max(1, quick_failures))
            log.error("%s (pid %s) %s; restarting it in %.1fs",
                      slot.name, slot.pid, slot.last_exit, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.stopping.wait()
            if not self.stopping.is_set():
                slot.restarts += 1

    def _ready(self, slot: _Slot, ready: dict[str, Any]) -> None:
        slot.ready = True
        if slot.index == 0:
            self._first_ready = ready
            assert self._role is not None
            # A port worker 0 picked for 0 (Res01's): the same one after a restart.
            picked = {k: int(v) for k, v in ready.get("ports", {}).items()
                      if k not in self._role.ports}
            if picked:
                self._role = replace(self._role, ports={**self._role.ports, **picked})
        if slot.restarts:
            log.info("%s restarted (pid %s)", slot.name, slot.pid)
        initial = self._initial
        if initial is not None and not initial.done() and all(s.ready for s in self.slots):
            initial.set_result(None)

    async def _run_once(self, slot: _Slot) -> int | None:
        """Start the worker, wait until it exits: its exit code, or None when
        it was stopped on request."""
        assert self._role is not None
        role = WorkerRole(**{**self._role.__dict__, "index": slot.index})
        control_r, control_w = os.pipe()
        ready_r, ready_w = os.pipe()
        try:
            index = ("--index", str(slot.index)) if slot.is_worker else ()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", slot.module, *index, "--control-fd", str(control_r),
                "--ready-fd", str(ready_w),
                pass_fds=(control_r, ready_w), stdin=asyncio.subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (control_r, control_w, ready_r, ready_w):
                os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                os.close(control_r)
            with contextlib.suppress(OSError):
                os.close(ready_w)
        slot.proc, slot.pid, slot.ready = proc, proc.pid, False
        self._write_state()
        loop = asyncio.get_running_loop()
        # Trusted both ways: this process started the reader and wrote the bytes.
        payload = pickle.dumps({"config": self.config, "args": vars(self.args), "role": role})
        try:
            # The write end stays open while the worker runs: its lifeline.
            await loop.run_in_executor(None, _write_all, control_w,
                                       _LENGTH.pack(len(payload)) + payload)
            ready = await self._read_ready(ready_r, proc)
            if ready is not None:
                self._ready(slot, ready)
            returncode = await proc.wait()
        except BrokenPipeError:  # it died before reading its configuration
            returncode = await proc.wait()
        finally:
            os.close(control_w)
            slot.ready = False
        if self.stopping.is_set() and returncode in _STOPPED:
            slot.last_exit = describe_exit(returncode)
            return None
        return returncode

    async def _read_ready(self, fd: int, proc: asyncio.subprocess.Process
                          ) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                line = await reader.readline()
        except TimeoutError:
            log.error("worker pid %d did not get ready in %.0fs; killing it", proc.pid,
                      READY_TIMEOUT)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return None
        finally:
            transport.close()
        if not line:
            return None  # it exited first
        data: dict[str, Any] = json.loads(line)
        return data

    def _write_state(self) -> None:
        if self._run_dir is None:
            return
        state = {
            "pid": os.getpid(),
            "started_at": self.started_at,
            "workers": [{"index": s.index, "pid": s.pid, "restarts": s.restarts,
                         "last_exit": s.last_exit} for s in self.slots if s.is_worker],
            "chain": [{"pid": s.pid, "restarts": s.restarts, "last_exit": s.last_exit}
                      for s in self.slots if not s.is_worker],
        }
        path = self._run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(state))
            tmp.replace(path)

    # --- signals ---------------------------------------------------------------------

    def _stop(self, sig: int) -> None:
        if not self.stopping.is_set():
            log.info("%s: stopping every worker", signal.Signals(sig).name)
        self.stopping.set()
        self._signal_workers(signal.SIGTERM)

    def _hup(self) -> None:
        from polyport.gateway.config import config_from_args
        from polyport.gateway.process.logging_setup import setup_logging

        try:  # the supervisor's own log lines follow the new settings
            new = config_from_args(self.args)
            setup_logging(new.log_format, new.log_level)
        except Exception as exc:  # noqa: BLE001 - the workers say what was wrong
            log.debug("supervisor keeps its logging settings: %s", exc)
        # Each worker reloads and says what changed (or why not).
        self._signal_workers(signal.SIGHUP, ready_only=True)

    def _signal_workers(self, sig: int, *, ready_only: bool = False) -> None:
        for slot in self.slots:
            if slot.proc is None or slot.proc.returncode is not None:
                continue
            if ready_only and not slot.ready:
                continue
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(sig)

    async def _stop_workers(self) -> int:
        """SIGTERM to every worker, wait for all: 0 when every one drained."""
        self.stopping.set()
        self._signal_workers(signal.SIGTERM)
        tasks = [s.task for s in self.slots if s.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        failed = [s for s in self.slots if s.failed_stopping]
        for s in failed:
            log.error("%s (pid %s) %s while stopping", s.name, s.pid, s.last_exit)
        log.info("stopped")
        return 1 if failed else 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

