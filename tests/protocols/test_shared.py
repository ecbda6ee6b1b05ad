"""The pieces every protocol package shares: error classes and settings."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from polyport.protocols.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from polyport.protocols.settings import settings_from


def test_local_and_remote_are_siblings() -> None:
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)
    with pytest.raises(LocalProtocolError):
        try:
            raise LocalProtocolError("our bug")
        except RemoteProtocolError:  # pragma: no cover - must not catch
            pytest.fail("a peer-error handler caught our own bug")


@dataclass(frozen=True)
class _Limits:
    max_frames: int = 10
    idle_timeout: float | None = 300.0
    required: tuple[str, ...] = ()
    strict: bool = False
    block: int = field(default=5, metadata={"setting": "demo_block_bytes"})
    max_event_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_frames < 1:
            raise ValueError("demo_max_frames must be at least 1")


def test_defaults_when_nothing_is_set() -> None:
    assert settings_from(_Limits, {}, prefix="demo") == _Limits()


def test_prefixed_shared_and_renamed_keys_from_text() -> None:
    got = settings_from(
        _Limits,
        {"demo_max_frames": "7", "idle_timeout": "2.5", "demo_required": "json, ack",
         "demo_strict": "yes", "demo_block_bytes": 9, "max_event_bytes": 4096,
         "other_max_frames": 1},
        prefix="demo", shared=("idle_timeout", "max_event_bytes"),
    )
    assert got == _Limits(max_frames=7, idle_timeout=2.5, required=("json", "ack"),
                          strict=True, block=9, max_event_bytes=4096)


def test_protocol_key_wins_over_shared_key() -> None:
    got = settings_from(_Limits, {"demo_idle_timeout": 1, "idle_timeout": 9},
                        prefix="demo", shared=("idle_timeout",))
    assert got.idle_timeout == 1.0


def test_bad_values_name_the_setting() -> None:
    with pytest.raises(ValueError, match="demo_max_frames: expected int"):
        settings_from(_Limits, {"demo_max_frames": "many"}, prefix="demo")
    with pytest.raises(ValueError, match="demo_strict"):
        settings_from(_Limits, {"demo_strict": "maybe"}, prefix="demo")
    with pytest.raises(ValueError, match="at least 1"):
        settings_from(_Limits, {"demo_max_frames": 0}, prefix="demo")


ROLE_FILES = ("frames.py", "wire.py", "state.py", "connection.py", "errors.py", "adapter.py",
              "client.py")


def _protocol_packages() -> list[Path]:
    """The package of every protocol the gateway serves (shared helper
    packages such as protocols/reactive have no listener of their own)."""
    import polyport.protocols as pkg
    from polyport.gateway.registry import discover

    root = Path(pkg.__path__[0])
    return [root / d.name for d in discover()]


def test_every_protocol_package_has_the_same_role_files() -> None:
    packages = _protocol_packages()
    assert len(packages) >= 5
    for package in packages:
        missing = [f for f in ROLE_FILES if not (package / f).exists()]
        assert not missing, f"{package.name} lacks {missing}"
        frames = importlib.import_module(f"polyport.protocols.{package.name}.frames")
        assert isinstance(frames.DEFAULT_PORT, int) and frames.PROTOCOL == package.name


def test_every_protocol_package_has_one_limits_class_built_one_way() -> None:
    from polyport.protocols.settings import ProtocolLimits

    for package in _protocol_packages():
        limits = importlib.import_module(f"polyport.protocols.{package.name}.limits").Limits
        assert issubclass(limits, ProtocolLimits), package
        assert limits.protocol == package.name, package
        assert limits.from_settings({}) == limits(), package


def test_every_protocol_builds_on_the_shared_errors() -> None:
    from polyport.protocols import errors as shared

    for package in _protocol_packages():
        errors = importlib.import_module(f"polyport.protocols.{package.name}.errors")
        assert issubclass(errors.RemoteProtocolError, shared.RemoteProtocolError), package
        assert issubclass(errors.LocalProtocolError, shared.LocalProtocolError), package
        assert not issubclass(errors.LocalProtocolError, errors.RemoteProtocolError), package


def _server_connections() -> dict[str, object]:
    from polyport.protocols.bson import connection as bson_conn
    from polyport.protocols.micromsg2 import connection as mm2_conn
    from polyport.protocols.reactivesocket import connection as rs_conn
    from polyport.protocols.rsocket import connection as rsocket_conn
    from polyport.protocols.segment import connection as segment_conn

    return {
        "bson": bson_conn.ServerConnection(),
        "micromsg2": mm2_conn.ServerConnection("server"),
        "reactivesocket": rs_conn.ServerConnection("tcp"),
        "rsocket": rsocket_conn.ServerConnection("tcp"),
        "segment": segment_conn.ServerConnection(),
    }


@pytest.mark.parametrize("name", ["bson", "micromsg2", "reactivesocket", "rsocket", "segment"])
def test_every_codec_shows_a_partial_frame_in_its_input_buffer(name: str) -> None:
    """The transport's frame_timeout asks every codec the same way: bytes of
    an incomplete frame are buffered, and ``taken`` moves only when a frame
    was decoded (the next partial one is a new frame, not the old one)."""
    from bench.fuzz import CODECS

    first = next(c for c in CODECS if c.name == name).seeds()[0][0]
    conn: Any = _server_connections()[name]
    buffer = conn.input_buffer
    conn.receive_data(first[:3])
    assert buffer.partial_frame and buffer.taken == 0
    conn.receive_data(first[3:-1])
    assert buffer.partial_frame and buffer.taken == 0  # still the same frame
    assert conn.receive_data(first[-1:])
    assert not buffer.partial_frame and buffer.taken == 1
