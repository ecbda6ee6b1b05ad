"""What the store knows about its own health, kept current by the work it
already does, so that a readiness probe costs no database round trip.

The writer (each commit), the tailer (each poll or read) and the schema check
(at start, then on a slow timer) report their round trips here;
:meth:`Health.snapshot` turns the latest reports into problems.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Readiness fails when no round trip succeeded for this long; the tailer
# polls at least every poll interval when nothing else reaches the database.
DEFAULT_STALE_AFTER = 5.0
SCHEMA_CHECK_INTERVAL = 30.0


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    # Seconds since the newest successful database round trip (None: none yet).
    last_ok_age: float | None
    # The newest failure, when it is newer than every success.
    failing: str | None
    stale_after: float
    # None when the schema is current; else what is wrong (or not checked yet).
    schema_problem: str | None

    @property
    def database_problem(self) -> str | None:
        """Why the database counts as unreachable; None when it is up."""
        if self.failing is not None:
            return f"database unreachable: {self.failing}"
        if self.last_ok_age is None:
            return "database unreachable: no successful round trip yet"
        if self.last_ok_age > self.stale_after:
            return f"database unreachable: no successful round trip for {self.last_ok_age:.1f}s"
        return None

    @property
    def problems(self) -> list[str]:
        out: list[str] = []
        if self.database_problem is not None:
            out.append(self.database_problem)
        if self.schema_problem is not None:
            out.append(self.schema_problem)
        return out


class Health:
    def __init__(
        self,
        stale_after: float = DEFAULT_STALE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stale_after = stale_after
        self._clock = clock
        self._last_ok: float | None = None
        self._last_failure: tuple[float, str] | None = None
        self._schema_problem: str | None = "schema not checked yet"

    def ok(self) -> None:
        """A database round trip just succeeded."""
        self._last_ok = self._clock()

    def failed(self, who: str, exc: BaseException) -> None:
        """A database round trip just failed."""
        self._last_failure = (self._clock(), f"{who}: {exc.__class__.__name__}: {exc}")

    def schema(self, problem: str | None) -> None:
        """The outcome of a schema check: None when current."""
        self._schema_problem = problem

    def snapshot(self) -> HealthSnapshot:
        now = self._clock()
        ok = self._last_ok
        failure = self._last_failure
        failing = None
        if failure is not None and (ok is None or failure[0] >= ok):
            failing = failure[1]
        return HealthSnapshot(
            last_ok_age=None if ok is None else now - ok,
            failing=failing,
            stale_after=self.stale_after,
            schema_problem=self._schema_problem,
        )
