"""Helpers for the adapter, error codes, and the ``bson`` name clash."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import bson
import pytest
from bson.binary import Binary
from bson.datetime_ms import DatetimeMS

import polyport.protocols.bson
from polyport.core.errors import ERROR_BY_CODE
from polyport.protocols import errors as shared_errors
from polyport.protocols.bson import (
    DEFAULT_MAX_EVENT_SIZE,
    DEFAULT_PORT,
    Emit,
    ProtocolError,
    Response,
    decode_frame,
    encode_frame,
    event_size,
    is_supported_version,
)
from polyport.protocols.bson import errors as errors_module
from polyport.protocols.bson import wire as wire_module
from polyport.protocols.bson.errors import LocalProtocolError, RequestError
from tests.protocols.bson.strategies import raw

PACKAGE_DIR = Path(polyport.protocols.bson.__file__).parent
REPO_ROOT = PACKAGE_DIR.parent.parent


def test_defaults() -> None:
    assert DEFAULT_PORT == 7451
    assert DEFAULT_MAX_EVENT_SIZE == 1024 * 1024


def test_error_codes_are_canonical() -> None:
    # The BSON errors spell their codes with the shared constants.
    codes = {v for k, v in vars(shared_errors).items() if k.isupper() and isinstance(v, str)}
    assert {"malformed", "too_large", "unauthenticated", "busy"} <= codes <= set(ERROR_BY_CODE)
    assert not [k for k in vars(errors_module) if k.startswith("ERR_")]


def test_errors_are_value_errors() -> None:
    assert issubclass(ProtocolError, ValueError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert not RequestError("x").fatal
    assert ProtocolError("x").to_response() == Response(ok=False, err_code="malformed", err_msg="x")


@pytest.mark.parametrize("version", ["0.1", "1.0", "0", "1", "1.2.3", "0.10", "1.0-SNAPSHOT"])
def test_supported_versions(version: str) -> None:
    assert is_supported_version(version)


@pytest.mark.parametrize("version", ["", "2.0", "10.0", "01.0", "1.x", "v1.0", " 1.0", "1.0\n"])
def test_unsupported_versions(version: str) -> None:
    assert not is_supported_version(version)


def test_event_size_is_the_encoded_event_document() -> None:
    event = {"sku": "A1", "qty": 2}
    assert event_size(event) == len(bson.encode(event)) == 26
    big = Emit("s", "t", {"data": "x" * DEFAULT_MAX_EVENT_SIZE})
    assert event_size(big.event) > DEFAULT_MAX_EVENT_SIZE


def test_event_size_of_unencodable_document() -> None:
    with pytest.raises(LocalProtocolError):
        event_size({"bad": object()})


def test_decode_options_are_lossless() -> None:
    u = uuid.uuid4()
    out_of_range = DatetimeMS(2**62)
    wire = raw(
        {
            "type": "EMIT",
            "frame": {
                "streamName": "s",
                "eventType": "t",
                "event": {
                    "u4": Binary(u.bytes, 4),
                    "u3": Binary(u.bytes, 3),
                    "far": out_of_range,
                    "when": datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC),
                },
            },
        }
    )
    frame = decode_frame(wire)
    assert isinstance(frame, Emit)
    assert frame.event["u4"] == Binary(u.bytes, 4)
    assert frame.event["far"] == out_of_range
    assert frame.event["when"].tzinfo is not None
    assert encode_frame(frame) == wire


def test_native_uuid_encodes_as_standard_binary() -> None:
    u = uuid.uuid4()
    frame = decode_frame(encode_frame(Emit("s", "t", {"id": u})))
    assert isinstance(frame, Emit)
    assert frame.event["id"] == Binary(u.bytes, 4)


def test_dbref_shaped_documents_are_documents() -> None:
    event = {"$ref": "x", "$id": 1}
    frame = decode_frame(raw({"type": "EMIT", "frame": {"streamName": "s", "eventType": "t",
                                                         "event": event}}))
    assert isinstance(frame, Emit)
    assert frame.event == event


def test_cannot_encode_foreign_objects() -> None:
    with pytest.raises(LocalProtocolError, match="not a BSON frames frame"):
        encode_frame("PING")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="cannot encode EMIT"):
        encode_frame(Emit("s", "t", {"k": {1, 2}}))


# --- pymongo's bson vs protocols.bson ------------------------------------------------------


def test_bson_is_pymongo() -> None:
    assert "site-packages" in (bson.__file__ or "")
    assert wire_module.bson is sys.modules["bson"] is bson
    assert polyport.protocols.bson.__name__ == "polyport.protocols.bson"
    assert hasattr(bson, "encode") and hasattr(bson, "decode")


def test_modules_use_future_annotations_and_absolute_imports() -> None:
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        futures = [
            n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"
        ]
        assert futures and futures[0].names[0].name == "annotations", path
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"relative import in {path}"


def _run(code: str, *, cwd: Path, pythonpath: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=cwd, env=env, capture_output=True, text=True,
        timeout=60,
    )


def test_import_from_elsewhere_uses_pymongo(tmp_path: Path) -> None:
    result = _run(
        "import polyport.protocols.bson, bson, sys; "
        "assert hasattr(bson, 'decode'), bson; "
        "assert sys.modules['polyport.protocols.bson'] is not bson; print('ok')",
        cwd=tmp_path,
        pythonpath=str(REPO_ROOT),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_shadowing_is_a_clear_error(tmp_path: Path) -> None:
    # With protocols/ itself on sys.path, "import bson" would find this package.
    result = _run("import bson", cwd=tmp_path, pythonpath=str(PACKAGE_DIR.parent))
    assert result.returncode != 0
    assert "shadowing pymongo's bson" in result.stderr


def test_a_frame_class_decoding_cannot_build_is_refused_when_the_module_loads() -> None:
    # frame_from_document builds frames positionally, without __init__
    # (wire._build_plan): a class it would build wrongly must fail at once.
    from dataclasses import dataclass, field

    from polyport.protocols.bson.frames import Field, Kind
    from polyport.protocols.bson.wire import _build_plan

    @dataclass(frozen=True, slots=True)
    class Swapped:
        a: str
        b: str
        FIELDS = (Field("b", "b", Kind.STRING), Field("a", "a", Kind.STRING))

    @dataclass(frozen=True, slots=True)
    class OptionalWithoutDefault:
        a: str
        FIELDS = (Field("a", "a", Kind.STRING, required=False),)

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: dict[str, object] = field(default_factory=dict)
        FIELDS = (Field("a", "a", Kind.DOCUMENT, required=False),)

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: str

        def __post_init__(self) -> None:
            pass
        FIELDS = (Field("a", "a", Kind.STRING),)

    for cls, why in ((Swapped, "in declaration order"),
                     (OptionalWithoutDefault, "needs a plain default"),
                     (Factory, "needs a plain default"), (Checked, "__post_init__")):
        with pytest.raises(TypeError, match=why):
            _build_plan(cls)  # type: ignore[arg-type]
