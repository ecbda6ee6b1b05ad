"""``cpu_scheduling``: which policy each setting means, that applying it
reaches every thread of the process, and that a refusal is a log line, not
a failure.  Policies are changed in a child process only: the test process
keeps its own.  The gateway's processes themselves are checked in
tests/gateway/test_workers.py (the chain-kill test)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from polyport.gateway.config import ConfigError, GatewayConfig, coerce
from polyport.gateway.process import scheduling
from polyport.gateway.process.scheduling import apply_policy, policy_for

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux policies")


@pytest.mark.parametrize(("setting", "workers", "policy"), [
    ("auto", 1, "normal"),
    ("auto", 2, "batch"),
    ("auto", 16, "batch"),
    ("batch", 1, "batch"),
    ("batch", 4, "batch"),
    ("normal", 1, "normal"),
    ("normal", 4, "normal"),
])
def test_each_setting_names_a_policy(setting: str, workers: int, policy: str) -> None:
    assert policy_for(setting, workers) == policy


def test_the_default_is_auto_and_a_bad_value_names_the_choices() -> None:
    assert GatewayConfig().cpu_scheduling == "auto"
    assert coerce("cpu_scheduling", " Batch ", "POLYPORT_CPU_SCHEDULING") == "batch"
    with pytest.raises(ConfigError, match=r"POLYPORT_CPU_SCHEDULING: expected one of "
                                          r"auto, batch, normal, got 'fifo'"):
        coerce("cpu_scheduling", "fifo", "POLYPORT_CPU_SCHEDULING")


# Starts a thread before the policy is applied (as a logging or executor
# thread would be) and one after, and reports every thread's policy.
_CHILD = """
import json, os, sys, threading
from polyport.gateway.process.scheduling import apply_policy
hold = threading.Event()
before = threading.Thread(target=hold.wait); before.start()
got = apply_policy(sys.argv[1], int(sys.argv[2]))
after = threading.Thread(target=hold.wait); after.start()
policies = sorted({os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")})
hold.set()
print(json.dumps({"got": got, "policies": policies, "threads": threading.active_count()}))
"""


def _child(setting: str, workers: int) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _CHILD, setting, str(workers)],
                         capture_output=True, text=True, timeout=60, check=True)
    doc: dict[str, object] = json.loads(out.stdout)
    return doc


@pytest.mark.parametrize(("setting", "workers"), [("auto", 2), ("batch", 1)])
def test_batch_reaches_every_thread_and_the_threads_started_later(
        setting: str, workers: int) -> None:
    doc = _child(setting, workers)
    assert doc == {"got": "batch", "policies": [os.SCHED_BATCH], "threads": 3}


@pytest.mark.parametrize(("setting", "workers"), [("auto", 1), ("normal", 4)])
def test_normal_leaves_the_default_policy(setting: str, workers: int) -> None:
    doc = _child(setting, workers)
    assert doc == {"got": "normal", "policies": [os.SCHED_OTHER], "threads": 3}


def test_a_kernel_that_refuses_is_one_warning_and_the_default_policy(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(scheduling.os, "sched_setscheduler", refuse)
    with caplog.at_level(logging.INFO, logger="polyport.gateway"):
        assert apply_policy("batch", 2) == "normal"
        assert apply_policy("auto", 2) == "normal"
    [asked, chosen] = caplog.records
    assert asked.levelno == logging.WARNING
    assert asked.getMessage() == (
        "cpu_scheduling batch: the kernel refused SCHED_BATCH (Operation not permitted); "
        "running with the default policy (cpu_scheduling = normal says nothing)")
    # Chosen by auto, not asked for: worth a line, not a warning.
    assert chosen.levelno == logging.INFO
    assert chosen.getMessage().startswith("cpu_scheduling auto: the kernel refused")


def test_a_platform_without_the_policy_runs_with_the_default(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delattr(scheduling.os, "SCHED_BATCH")
    with caplog.at_level(logging.INFO, logger="polyport.gateway"):
        assert apply_policy("batch", 2) == "normal"
    assert "SCHED_BATCH does not exist on this platform" in caplog.text
