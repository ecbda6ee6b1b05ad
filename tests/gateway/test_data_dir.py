"""Issue 29 item 1: the data directory does not depend on the working
directory, and no command but ``serve`` and ``migrate`` makes a cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polyport.gateway import config as config_module
from polyport.gateway.config import GatewayConfig, default_data_dir
from polyport.gateway.process import database
from polyport.gateway.process.database import NoDatabase, database_url
from tests.gateway.test_cli_errors import assert_one_clean_line, polyport


def test_the_default_is_the_same_from_every_directory(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_data_dir() == "/var/lib/polyport"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == str(tmp_path / "xdg" / "polyport")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == str(tmp_path / "home" / ".local" / "share" / "polyport")
    assert GatewayConfig().data_dir == default_data_dir()


def test_an_admin_command_never_creates_a_cluster(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    nothing = elsewhere / "no-such-data"
    for command in (("users", "list"), ("subscriptions", "list"), ("binders", "list")):
        done = polyport(*command, "--data-dir", str(nothing))
        line = assert_one_clean_line(done, str(nothing), "--data-dir", "--database-url")
        assert "no polyport database" in line
        assert not nothing.exists(), command  # nothing was made


def test_serve_does_not_replace_a_cluster_under_the_old_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "polyport-data" / "pgdata").mkdir(parents=True)
    (tmp_path / "polyport-data" / "pgdata" / "PG_VERSION").write_text("16\n")
    new = str(tmp_path / "new-default")
    monkeypatch.setattr(database, "default_data_dir", lambda: new)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NoDatabase) as refused, database_url(GatewayConfig(data_dir=new)):
        pass
    assert f"--data-dir {tmp_path / 'polyport-data'}" in str(refused.value)
    assert not (tmp_path / "new-default" / "pgdata").exists()
    assert config_module.OLD_DEFAULT_DATA_DIR == "polyport-data"


def test_an_admin_command_leaves_a_serving_gateways_database_to_it(tmp_path: Path) -> None:
    """The gateway supervises its embedded database: a command run while it is
    down says so, and neither starts it nor (later) stops it under the gateway."""
    data = tmp_path / "data"
    (data / "pgdata").mkdir(parents=True)
    (data / "pgdata" / "PG_VERSION").write_text("16\n")
    (data / "gateway.json").write_text(json.dumps({"pid": os.getpid(), "listeners": {}}))
    with pytest.raises(NoDatabase) as refused, database_url(
            GatewayConfig(data_dir=str(data)), create=False):
        pass
    assert f"pid {os.getpid()}" in str(refused.value) and "retry" in str(refused.value)
    assert not (data / "pgdata" / "postmaster.pid").exists()
