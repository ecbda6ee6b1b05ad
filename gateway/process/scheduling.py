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

- ``forwarders``: ``SCHED_BATCH`` only for the workers whose appends a
  commit chain elsewhere commits (every worker but the one hosting the
  chain, or every worker beside a chain process); the process that commits
  (the worker hosting the chain, the chain process, a gateway of one
  process, each worker under ``commit_chain = off``) keeps the default
  policy, and with it the right to preempt on waking.

What ``forwarders`` trades.  Every commit goes through the process that
commits, so its turns are the gateway's critical path; a forwarding
worker woken by the chain's answer could preempt it mid-turn.  On a 2-core
machine, two workers with the chain hosted in one of them
(docs/performance.md, session 29), in five paired runs at 32 publishers:
two workers' CPU per event against one worker's fell from 1.21-1.40x to
0.98-1.17x in eight of the ten protocol pairs, and went from 1.13x to
1.41x and from 1.22x to 1.24x in the other two (BSON); the forwarding
worker waited 0.20-0.21 times per event of its own instead of 0.28-0.41.
At 256 publishers, with every core busy, BSON did not move and MicroMsg2
spent 4-11 % more per event: a woken forwarder then waits for a busy core,
and so do its clients' acknowledgements.  Left off by default for that.

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


def policy_for(setting: str, *, commits: bool) -> str:
    """The policy (``batch`` or ``normal``) that ``cpu_scheduling =
    setting`` gives a process that commits appends (``commits``) or hands
    them to a commit chain elsewhere."""
    if setting == "forwarders":
        return "normal" if commits else "batch"
    return "batch" if setting == "batch" else "normal"


def apply_policy(setting: str, *, commits: bool = True) -> str:
    """Give every thread of this process the policy ``cpu_scheduling =
    setting`` names for it (see :func:`policy_for`); the policy it runs
    under (``batch`` or ``normal``).  Threads started later inherit it."""
    if policy_for(setting, commits=commits) != "batch":
        return "normal"
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None:
        log.warning("cpu_scheduling %s: SCHED_BATCH does not exist on this platform; "
                    "running with the default policy", setting)
        return "normal"
    try:
        for tid in _threads():
            os.sched_setscheduler(tid, batch, os.sched_param(0))
    except OSError as exc:
        log.warning("cpu_scheduling %s: the kernel refused SCHED_BATCH (%s); running "
                    "with the default policy (cpu_scheduling = normal says nothing)",
                    setting, exc.strerror or exc)
        return "normal"
    return "batch"
