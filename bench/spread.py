"""W1's publishers spread over several client processes (``--client-processes
N`` of ``bench peers`` and ``bench workers``).

One bench process on one event loop saturates at one core: on a 16-core
machine it measured NATS JetStream at 18k events/s while a load generator
spread over 8 processes measured 100k (issue 26).  Here the bench process
starts N children (``python -m bench.spread``), hands each its share of the
publishers on stdin (the database URL included: never argv), and waits until
every child has opened its connections; then it starts the CPU meter, tells
all of them to go, and adds up what they acknowledged.  Each child measures
its own rate over its own closed loop of ``seconds`` and its own CPU, which
the parent adds to its ``client`` cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from bench.peers import (
    REPO,
    BenchError,
    Env,
    Meter,
    NatsServer,
    Roots,
    ServeProcess,
    client_loop,
    one_line,
)


async def w1_spread(env: Env, meter: Meter, system: str, n: int, seconds: float) -> float:
    """W1 with ``n`` publishers over ``env.client_processes`` children."""
    procs = max(1, min(env.client_processes, n))
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    spec: dict[str, Any] = {
        "system": system,
        "seconds": seconds,
        "raw_dsn": env.raw_dsn,
        "ports": {k: list(v) for k, v in env.gateway.ports.items()} if env.gateway else {},
        "nats": env.nats.url if env.nats is not None else None,
    }
    children = Children("bench.spread", "client process")
    try:
        await children.start([{**spec, "publishers": share, "index": i}
                              for i, share in enumerate(shares)])
        meter.start()
        await children.go()
        done = await children.results()
        meter.stop()
    finally:
        await children.close()
    meter.cores["client"] = meter.cores.get("client", 0.0) + sum(
        d["cpu"] for d in done) / max(meter.wall, 1e-9)
    return float(sum(d["rate"] for d in done))


class Children:
    """Bench child processes (``python -m MODULE``), one JSON line at a time:
    each gets its spec on stdin (never argv: it may hold a database URL),
    answers ``ready`` (or an error), waits for ``go``, and ends with one
    line of results (or an error)."""

    def __init__(self, module: str, what: str) -> None:
        self.module = module
        self.what = what  # how errors name a child
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, specs: list[dict[str, Any]]) -> None:
        """One child per spec; returns once every one is ready."""
        for spec in specs:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", self.module, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, cwd=REPO)
            self.procs.append(child)
            assert child.stdin is not None
            child.stdin.write((json.dumps(spec) + "\n").encode())
            await child.stdin.drain()
        for child in self.procs:
            self._check(await _line(child))

    async def go(self) -> None:
        for child in self.procs:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()

    async def results(self) -> list[dict[str, Any]]:
        done = [await _line(child) for child in self.procs]
        for d in done:
            self._check(d)
        return done

    async def close(self) -> None:
        for child in self.procs:
            if child.returncode is None:
                child.kill()
            await child.wait()

    def _check(self, line: dict[str, Any]) -> None:
        if line.get("error"):
            raise BenchError(f"{self.what}: {line['error']}")


async def _line(child: asyncio.subprocess.Process) -> dict[str, Any]:
    assert child.stdout is not None
    raw = await child.stdout.readline()
    if not raw:
        raise BenchError(f"client process {child.pid} exited ({await child.wait()})")
    data: dict[str, Any] = json.loads(raw)
    return data


# --- the child -----------------------------------------------------------------------


async def _child() -> int:
    import zmq.asyncio

    from bench.peers import (
        _nats_connect,
        _nats_op,
        _raw_op,
        _unique,
        close_all,
        closed_loop,
        open_many,
        open_publisher,
    )

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    spec = json.loads(await reader.readline())
    system, n, seconds = spec["system"], spec["publishers"], spec["seconds"]
    zmq_ctx = zmq.asyncio.Context()
    gateway = None
    if spec["ports"]:
        gateway = ServeProcess.__new__(ServeProcess)
        gateway.ports = {k: (v[0], int(v[1])) for k, v in spec["ports"].items()}
    nats = None
    if spec["nats"]:
        nats = NatsServer.__new__(NatsServer)
        nats.url = spec["nats"]
    env = Env(spec["raw_dsn"], gateway, nats, zmq_ctx, Roots())
    closers: list[Any] = []
    try:
        tag = _unique(f"w1s{spec['index']}")
        if system == "raw":
            import asyncpg

            conns = await open_many(n, lambda _i: asyncpg.connect(env.raw_dsn))
            closers = conns
            ops = [_raw_op(c, tag) for c in conns]
        elif system == "nats":
            conns = await open_many(n, lambda _i: _nats_connect(spec["nats"]))
            closers = conns
            ops = [_nats_op(nc.jetstream(), f"bench.{tag}.{i}") for i, nc in enumerate(conns)]
        else:
            pubs = await open_many(n, lambda i: open_publisher(env, system, f"{tag}-{i}"))
            closers = pubs
            ops = [p.publish for p in pubs]
        tell_parent({"ready": True})
        await reader.readline()  # go
        meter = Meter(Roots())
        rate = await closed_loop(meter, ops, seconds)
        tell_parent({"rate": rate, "cpu": meter.cores["client"] * meter.wall})
    except Exception as exc:  # noqa: BLE001 - reported to the parent in one line
        tell_parent({"error": one_line(exc)})
        return 1
    finally:
        await close_all(closers)
        zmq_ctx.destroy(linger=0)
    return 0


def tell_parent(doc: dict[str, Any]) -> None:
    """A child's one line to :class:`Children` (ready, results or an error)."""
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def main() -> int:
    factory, _name = client_loop()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_child())


def default_client_processes() -> int:
    """One client process per 4 cores (at least one)."""
    return max(1, (os.cpu_count() or 1) // 4)


if __name__ == "__main__":
    sys.exit(main())
