"""The event loop of ``polyport serve``: uvloop when it can be imported
(``event_loop = auto``), asyncio on request or as the fallback, and an
explicit ``uvloop`` that cannot be had is a configuration error."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from polyport.gateway.config import ConfigError, available_cores, load_config
from polyport.gateway.process.eventloop import choose_loop, run, running_loop_name
from tests.listeners import port_flags

ALL_OFF = port_flags("off", but=("http",))


async def _name() -> str:
    await asyncio.sleep(0)
    return running_loop_name()


def test_auto_runs_uvloop_when_it_is_installed() -> None:
    choice = choose_loop("auto")
    assert choice.name == "uvloop" and choice.version
    assert "auto" in choice.describe()
    assert run(_name(), choice) == "uvloop"


def test_asyncio_is_the_standard_loop_whatever_the_policy() -> None:
    import uvloop

    choice = choose_loop("asyncio")
    old = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        assert run(_name(), choice) == "asyncio"
    finally:
        asyncio.set_event_loop_policy(old)


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes ``import uvloop`` raise ImportError.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    choice = choose_loop("auto")
    assert choice.name == "asyncio" and "not installed" in choice.describe()
    assert run(_name(), choice) == "asyncio"
    with pytest.raises(ConfigError, match="uvloop cannot be imported"):
        choose_loop("uvloop")


def test_event_loop_and_workers_settings(tmp_path: Path) -> None:
    assert load_config(env={}).event_loop == "auto"
    assert load_config(env={}).workers == 1
    conf = tmp_path / "p.toml"
    conf.write_text('event_loop = "asyncio"\nworkers = 3\n')
    assert load_config(str(conf), env={}).event_loop == "asyncio"
    assert load_config(str(conf), env={}).workers == 3
    # The environment over the file, flags over both (config.py's order).
    env = {"POLYPORT_EVENT_LOOP": "UVLOOP", "POLYPORT_WORKERS": "auto"}
    cfg = load_config(str(conf), env=env)
    assert cfg.event_loop == "uvloop" and cfg.workers == available_cores()
    cfg = load_config(str(conf), env=env, overrides={"event_loop": "asyncio", "workers": "2"})
    assert cfg.event_loop == "asyncio" and cfg.workers == 2
    with pytest.raises(ConfigError, match="POLYPORT_EVENT_LOOP: expected one of auto"):
        load_config(env={"POLYPORT_EVENT_LOOP": "tokio"})
    for bad in ("0", "-1", "many", "1000"):
        with pytest.raises(ConfigError, match="POLYPORT_WORKERS"):
            load_config(env={"POLYPORT_WORKERS": bad})


@pytest.mark.parametrize(("setting", "expected"), [(None, "uvloop"), ("asyncio", "asyncio")])
async def test_serve_says_which_loop_runs(
    db_url: str, tmp_path: Path, setting: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPORT_")}
    if setting is not None:
        env["POLYPORT_EVENT_LOOP"] = setting
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polyport.gateway.cli.main", "serve", "--database-url", db_url,
        "--data-dir", str(tmp_path), "--http-port", "0", *ALL_OFF,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stderr is not None and proc.stdout is not None
    try:
        seen = ""
        while "event loop:" not in seen:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, f"serve exited: {seen}"
            seen = line
        assert f"event loop: {expected}" in seen, seen
        # Signal handlers are in place once it listens: SIGTERM is then a drain.
        while "http listening on" not in (await asyncio.wait_for(proc.stdout.readline(), 60)
                                          ).decode():
            pass
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 60)
    assert proc.returncode == 0
