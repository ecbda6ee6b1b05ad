"""The pipeline outside its own process: acceptance 2 (a standalone Spark
master and worker from the installed pyspark, on loopback, running `export`
with ``--master spark://127.0.0.1:PORT``), and ``spark-submit`` running the
same job with its own ``--master``, which the pipeline keeps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="PySpark is not installed: pip install -e '.[test,pipeline]'")

from pyspark.sql import SparkSession  # noqa: E402

from polyport.core.commands import Append  # noqa: E402
from polyport.core.events import EventData  # noqa: E402
from polyport.core.store import EventStore  # noqa: E402
from polyport.pipeline.session import find_jdbc_driver  # noqa: E402
from tests.pipeline.conftest import (  # noqa: E402
    assert_exported_once,
    cli_env,
    polyport_cmd,
    published_files,
    run_cli,
)

pytestmark = pytest.mark.timeout(240)

SPARK_BIN = Path(pyspark.__file__).resolve().parent / "bin"
# Partition values Spark must escape in directory names.
CONTEXTS = ("plain", "a/b=c %d", "ünï {x}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def fill(store: EventStore, per_context: int = 1_000) -> int:
    for context in CONTEXTS:
        for i in range(per_context // 100):
            events = tuple(
                EventData(f"t{j % 3}", json.dumps({"i": i, "j": j}).encode(),
                          headers={"k": str(j)}, content_type="application/json")
                for j in range(100)
            )
            await store.append(Append(context, f"s-{i % 7}", events))
    return len(CONTEXTS) * per_context


def master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
        state: dict[str, Any] = json.load(r)
        return state


@contextlib.contextmanager
def standalone_cluster(work: Path) -> Iterator[tuple[str, int]]:
    """A Spark master and one worker (1 core) as subprocesses, on loopback."""
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = cli_env()
    spark_class = str(SPARK_BIN / "spark-class")
    logs = [open(work / "master.log", "wb"), open(work / "worker.log", "wb")]  # noqa: SIM115
    procs = [subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(ui)],
        stdout=logs[0], stderr=subprocess.STDOUT, env=env, start_new_session=True)]
    try:
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
             "--host", "127.0.0.1", "--webui-port", str(worker_ui), "--cores", "1",
             "--memory", "1g", "--work-dir", str(work / "worker")],
            stdout=logs[1], stderr=subprocess.STDOUT, env=env, start_new_session=True))
        deadline = time.monotonic() + 90
        while True:
            for p in procs:
                assert p.poll() is None, (work / "master.log").read_text()[-2000:]
            with contextlib.suppress(OSError, ValueError):
                if master_state(ui)["aliveworkers"] >= 1:
                    break
            assert time.monotonic() < deadline, "the worker never registered"
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}", ui
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(10)
        for f in logs:
            f.close()


async def test_export_on_a_standalone_cluster(
    spark: SparkSession, store: EventStore, db_url: str, tmp_path: Path
) -> None:
    total = await fill(store)
    out = tmp_path / "export"
    with standalone_cluster(tmp_path) as (master, ui):
        done = await asyncio.to_thread(run_cli, polyport_cmd(
            "pipeline", "export", "--out", str(out), "--database-url", db_url,
            "--master", master, "--conf", "spark.cores.max=1",
            "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.app.name=polyport-cluster-test"))
        assert done.returncode == 0, done.stderr[-3000:]
        apps = master_state(ui)["completedapps"]
    assert f"master {master}," in done.stderr
    assert [a["name"] for a in apps] == ["polyport-cluster-test"]
    # Progress: partitions and rows, per phase.
    assert f"{total:,}/{total:,} rows read (100%)" in done.stderr
    assert f"{total:,} rows written" in done.stderr
    # Context names come back from the escaped directory names intact.
    await assert_exported_once(spark, db_url, out, total)
    assert len({p.parent.parent for p in published_files(out)}) == len(CONTEXTS)


async def test_spark_submit_keeps_its_master(
    spark: SparkSession, store: EventStore, db_url: str, tmp_path: Path
) -> None:
    total = await fill(store, per_context=300)
    jar = find_jdbc_driver().jar
    assert jar is not None
    out = tmp_path / "export"
    env = cli_env(PYSPARK_PYTHON=sys.executable)
    done = await asyncio.to_thread(run_cli, [
        str(SPARK_BIN / "spark-submit"), "--master", "local[1]", "--jars", str(jar),
        "--conf", "spark.ui.enabled=false",
        str(Path(__file__).resolve().parents[2] / "pipeline" / "__main__.py"),
        "export", "--out", str(out), "--database-url", db_url,
    ], env)
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit's PythonRunner sends the Python driver's stderr to its stdout.
    assert "master local[1]," in done.stdout
    await assert_exported_once(spark, db_url, out, total)

    # Asking for another master than spark-submit's is refused, not applied.
    clash = await asyncio.to_thread(run_cli, [
        str(SPARK_BIN / "spark-submit"), "--master", "local[1]", "--jars", str(jar),
        "--conf", "spark.ui.enabled=false",
        str(Path(__file__).resolve().parents[2] / "pipeline" / "__main__.py"),
        "export", "--out", str(out), "--database-url", db_url, "--master", "local[2]",
    ], env)
    assert clash.returncode == 1
    assert "give only one of them" in clash.stdout
