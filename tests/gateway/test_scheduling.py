"""``cpu_scheduling``: applying ``batch`` reaches every thread of the
process, ``normal`` changes nothing, and a refusal is a log line, not a
failure.  Policies are changed in a child process only: the test process
keeps its own.  The gateway's processes themselves are checked in
tests/gateway/test_workers.py (the SIGTERM and chain-kill tests)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from polyport.gateway.config import ConfigError, GatewayConfig, coerce
from polyport.gateway.process import scheduling
from polyport.gateway.process.scheduling import apply_policy

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux policies")


def test_the_default_is_normal_and_a_bad_value_names_the_choices() -> None:
    assert GatewayConfig().cpu_scheduling == "normal"
    assert coerce("cpu_scheduling", " Batch ", "POLYPORT_CPU_SCHEDULING") == "batch"
    assert coerce("cpu_scheduling", "forwarders", "POLYPORT_CPU_SCHEDULING") == "forwarders"
    with pytest.raises(ConfigError, match=r"POLYPORT_CPU_SCHEDULING: expected one of "
                                          r"normal, batch, forwarders, got 'fifo'"):
        coerce("cpu_scheduling", "fifo", "POLYPORT_CPU_SCHEDULING")


# Starts a thread before the policy is applied (as a logging or executor
# thread would be) and one after, and reports every thread's policy.
_CHILD = """
import json, os, sys, threading
from polyport.gateway.process.scheduling import apply_policy
hold = threading.Event()
before = threading.Thread(target=hold.wait); before.start()
got = apply_policy(sys.argv[1], commits=sys.argv[2] == "commits")
after = threading.Thread(target=hold.wait); after.start()
policies = sorted({os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")})
hold.set()
print(json.dumps({"got": got, "policies": policies, "threads": threading.active_count()}))
"""


def _child(setting: str, role: str = "commits") -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _CHILD, setting, role],
                         capture_output=True, text=True, timeout=60, check=True)
    doc: dict[str, object] = json.loads(out.stdout)
    return doc


def test_batch_reaches_every_thread_and_the_threads_started_later() -> None:
    assert _child("batch") == {"got": "batch", "policies": [os.SCHED_BATCH], "threads": 3}


def test_forwarders_lowers_only_a_process_that_does_not_commit() -> None:
    assert _child("forwarders", "forwards") == {
        "got": "batch", "policies": [os.SCHED_BATCH], "threads": 3}
    assert _child("forwarders", "commits") == {
        "got": "normal", "policies": [os.SCHED_OTHER], "threads": 3}


def test_each_setting_names_a_policy_for_either_role() -> None:
    table = {(setting, commits): scheduling.policy_for(setting, commits=commits)
             for setting in ("normal", "batch", "forwarders") for commits in (True, False)}
    assert table == {("normal", True): "normal", ("normal", False): "normal",
                     ("batch", True): "batch", ("batch", False): "batch",
                     ("forwarders", True): "normal", ("forwarders", False): "batch"}


def test_normal_leaves_the_default_policy() -> None:
    assert _child("normal") == {"got": "normal", "policies": [os.SCHED_OTHER], "threads": 3}


def test_a_kernel_that_refuses_is_one_warning_and_the_default_policy(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(scheduling.os, "sched_setscheduler", refuse)
    with caplog.at_level(logging.INFO, logger="polyport.gateway"):
        assert apply_policy("batch") == "normal"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "cpu_scheduling batch: the kernel refused SCHED_BATCH (Operation not permitted); "
        "running with the default policy (cpu_scheduling = normal says nothing)")


def test_a_platform_without_the_policy_runs_with_the_default(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delattr(scheduling.os, "SCHED_BATCH")
    with caplog.at_level(logging.INFO, logger="polyport.gateway"):
        assert apply_policy("batch") == "normal"
    assert "SCHED_BATCH does not exist on this platform" in caplog.text
