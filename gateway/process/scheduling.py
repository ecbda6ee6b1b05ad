"""How the kernel schedules the gateway's processes (``cpu_scheduling``).

- ``batch``: Linux's ``SCHED_BATCH`` for every thread of a worker and of the
  commit chain process.  Same priority and nice value as before; the one
  difference is that a thread of ours that wakes up does not preempt the
  thread running on that core: it runs on an idle core, or when the
  running one blocks or its slice ends.
- ``normal``: the default policy (``SCHED_OTHER``).
- ``auto`` (default): ``batch`` for a gateway of several processes
  (``--workers`` > 1), ``normal`` for one process.

Why.  The processes of a multi-process gateway wake each other on every
append: a worker hands its turn's appends to the commit chain, the chain
answers with the results.  With ``SCHED_OTHER`` each of those wake-ups may
preempt the process that caused it in the middle of its event-loop turn,
on a machine whose cores are all busy, so that turn finishes later and
every process runs more, shorter turns.  Measured on 2 cores (W1, two
workers against one, docs/performance.md, session 15): two workers went
from 0.92x one worker's events/s at 1.26x its CPU per event to 1.05-1.12x
at 1.03-1.09x, and one worker did not change.  sched(7) names this use:
"workloads that want a deterministic scheduling policy without
interactivity causing extra preemptions (between the workload's tasks)".
A single process has no sibling to wake, so ``auto`` leaves it alone.

Lowering a thread to ``SCHED_BATCH`` needs no privilege.  Where the
platform refuses (not Linux, a sandbox without the call) the gateway says
so once and runs with the default policy: this is a performance setting,
never a reason not to start.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("polyport.gateway")


def policy_for(setting: str, workers: int) -> str:
    """``batch`` or ``normal``: what ``cpu_scheduling = setting`` means for
    a gateway of ``workers`` processes."""
    if setting == "auto":
        return "batch" if workers > 1 else "normal"
    return setting


def _threads() -> list[int]:
    """This process's thread ids: a policy belongs to a thread, and threads
    created before the call (a logging or executor thread) keep theirs."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # the calling thread


def apply_policy(setting: str, workers: int) -> str:
    """Give this process the policy ``cpu_scheduling = setting`` asks for;
    the policy it runs under (``batch`` or ``normal``).  Threads started
    later inherit it."""
    if policy_for(setting, workers) != "batch":
        return "normal"
    # Asked for by name: a warning.  Chosen by auto: worth a line, no more.
    level = logging.WARNING if setting == "batch" else logging.INFO
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None:
        log.log(level, "cpu_scheduling %s: SCHED_BATCH does not exist on this platform; "
                "running with the default policy", setting)
        return "normal"
    try:
        for tid in _threads():
            os.sched_setscheduler(tid, batch, os.sched_param(0))
    except OSError as exc:
        log.log(level, "cpu_scheduling %s: the kernel refused SCHED_BATCH (%s); running "
                "with the default policy (cpu_scheduling = normal says nothing)",
                setting, exc.strerror or exc)
        return "normal"
    return "batch"
