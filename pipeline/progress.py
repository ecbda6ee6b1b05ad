"""Progress of a pipeline job on stderr: rows read out of a total known
before the work starts, and rows written, from Spark's task-end metrics.

A listener registered once per SparkContext (through the py4j callback
server) counts every finished task; a job's :class:`Progress` looks at the
counts since its phase began and prints a line whenever they changed, at most
every ``interval`` seconds, plus the job's own summary lines.  Only a phase
given a ``total`` (the rows PostgreSQL says the phase will read) shows
progress: counting Spark's tasks instead gives a total that grows as stages
are planned (1/1, 1/3, 3/4, …), which says nothing about the time left.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(slots=True)
class Counts:
    tasks_total: int = 0
    tasks_done: int = 0
    rows_read: int = 0
    rows_written: int = 0

    def copy(self) -> Counts:
        return Counts(self.tasks_total, self.tasks_done, self.rows_read, self.rows_written)

    def minus(self, other: Counts) -> Counts:
        return Counts(
            self.tasks_total - other.tasks_total,
            self.tasks_done - other.tasks_done,
            self.rows_read - other.rows_read,
            self.rows_written - other.rows_written,
        )


class TaskListener:
    """Implements Spark's SparkListenerInterface from Python; only stage
    submissions and task ends matter, every other event is ignored."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = Counts()

    def snapshot(self) -> Counts:
        with self._lock:
            return self._counts.copy()

    def onStageSubmitted(self, event: Any) -> None:  # Java's name
        tasks = int(event.stageInfo().numTasks())
        with self._lock:
            self._counts.tasks_total += tasks

    def onTaskEnd(self, event: Any) -> None:
        metrics = event.taskMetrics()
        read = written = 0
        if metrics is not None:
            read = int(metrics.inputMetrics().recordsRead())
            written = int(metrics.outputMetrics().recordsWritten())
        if event.reason().toString() != "Success":
            return  # a failed attempt's rows are read again by its retry
        with self._lock:
            self._counts.tasks_done += 1
            self._counts.rows_read += read
            self._counts.rows_written += written

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on"):
            return _ignore
        raise AttributeError(name)

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.spark.scheduler.SparkListenerInterface"]


def _ignore(*_args: Any) -> None:
    return None


_listeners: dict[int, TaskListener | None] = {}
_listeners_lock = threading.Lock()


def task_listener(spark: SparkSession) -> TaskListener | None:
    """The context's listener, registered on first use; None when the py4j
    callback server cannot run (progress then shows phases only)."""
    sc = spark.sparkContext
    key = id(sc)
    with _listeners_lock:
        if key not in _listeners:
            try:
                from pyspark.java_gateway import ensure_callback_server_started

                gateway = sc._gateway
                assert gateway is not None and sc._jsc is not None
                ensure_callback_server_started(gateway)
                listener = TaskListener()
                sc._jsc.sc().addSparkListener(listener)
                _listeners[key] = listener
            except Exception as exc:  # noqa: BLE001 - progress must never stop a job
                sys.stderr.write(f"pipeline: no task progress available ({exc})\n")
                _listeners[key] = None
        return _listeners[key]


class Progress:
    """``with Progress(spark, "export") as p: p.phase("read", "…"); …; p.phase("done", "…")``."""

    def __init__(
        self, spark: SparkSession, job: str, *, out: IO[str] | None = None, interval: float = 2.0
    ) -> None:
        self.job = job
        self._out = out if out is not None else sys.stderr
        self._interval = interval
        self._listener = task_listener(spark)
        self._base = self._listener.snapshot() if self._listener else Counts()
        self._phase = "starting"
        self._total: int | None = None
        self._last_line = ""
        self._say_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{job}", daemon=True)
        self.started = time.monotonic()

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._report()

    def counts(self) -> Counts:
        if self._listener is None:
            return Counts()
        return self._listener.snapshot().minus(self._base)

    def say(self, message: str) -> None:
        self._out.write(f"pipeline {self.job}: {message}\n")
        self._out.flush()

    def phase(self, name: str, detail: str = "", *, total: int | None = None) -> None:
        """Start a phase: its detail once, then, with ``total`` (rows the phase
        reads), progress lines under its name."""
        self._report()
        with self._say_lock:
            self._phase = name
            self._total = total
            # Counts are per phase from here on.
            if self._listener is not None:
                self._base = self._listener.snapshot()
            self._last_line = ""
            self.say(f"{name}: {detail}" if detail else name)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        c = self.counts()
        total = self._total or 0
        percent = 100 * c.rows_read // total if total else 100
        return (
            f"{self._phase}: {c.rows_read:,}/{total:,} rows read ({percent}%), "
            f"{c.rows_written:,} rows written"
        )

    def _report(self) -> None:
        """A progress line, in a phase with a total, when the numbers moved."""
        if self._listener is None or self._total is None or self.counts().tasks_done == 0:
            return
        with self._say_lock:
            line = self.line()
            if line != self._last_line:
                self._last_line = line
                self.say(line)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._report()
