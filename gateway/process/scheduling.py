"""How the kernel schedules the gateway's processes (``cpu_scheduling``).

- ``normal`` (default): the kernel's default policy (``SCHED_OTHER``).
- ``batch``: Linux's ``SCHED_BATCH`` for every thread of the gateway's
  processes (the single process, or every worker and the commit chain
  process).  Same priority and nice value; the one difference is that a
  thread of ours that wakes up does not preempt the thread running on that
  core: it takes an idle core, or waits until the running one blocks or
  its slice ends.

What it trades.  The processes of a multi-process gateway wake each other
on every append (a worker hands its turn's appends to the commit chain, the
chain answers), and under the default policy each wake-up may preempt the
process that caused it in the middle of its event-loop turn when every core
is busy: that turn finishes later, and every process runs more, shorter
turns.  ``batch`` lets each turn run to its end.  Measured on a noisy
2-core machine (docs/performance.md, session 15): in two of three paired
runs two workers' W1 rose 9-13 % under it through BSON and MicroMsg2; in
the third MicroMsg2 rose 20 % and BSON fell 10 % (one worker: unchanged in
one run, 10-15 % lower in another).  W3's latency through two workers rose
every time (p50 +45-84 %, p99 +32-43 %): a woken worker now waits for
whatever runs on a busy core, the client's and PostgreSQL's processes
included.  So it is
left off by default: a setting to measure on a throughput-bound,
saturated machine (``bench workers --cpu-scheduling normal,batch``).  With
a core to spare for every process a woken thread takes an idle core, and
the policy should change neither figure.

Lowering a thread to ``SCHED_BATCH`` needs no privilege.  Where the
platform refuses (not Linux, a sandbox without the call) the process says
so in one line and runs with the default policy: this is a performance
setting, never a reason not to start.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("polyport.gateway")


def _threads() -> list[int]:
    """This process's thread ids: a policy belongs to a thread, and threads
    created before the call (a logging or executor thread) keep theirs."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # the calling thread


def apply_policy(setting: str) -> str:
    """Give every thread of this process the policy ``cpu_scheduling =
    setting`` names; the policy it runs under (``batch`` or ``normal``).
    Threads started later inherit it."""
    if setting != "batch":
        return "normal"
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None:
        log.warning("cpu_scheduling batch: SCHED_BATCH does not exist on this platform; "
                    "running with the default policy")
        return "normal"
    try:
        for tid in _threads():
            os.sched_setscheduler(tid, batch, os.sched_param(0))
    except OSError as exc:
        log.warning("cpu_scheduling batch: the kernel refused SCHED_BATCH (%s); running "
                    "with the default policy (cpu_scheduling = normal says nothing)",
                    exc.strerror or exc)
        return "normal"
    return "batch"
