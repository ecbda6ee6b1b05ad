"""The draft's own payloads on top of the event service's schema.

The schema both protocols serve (requests, answers, event maps) is
``protocols/reactive/payloads.py``, exported here under its old names; SETUP
data (credentials and context) is the draft's alone, and so is its ERROR data
(``errors.py``, with the canonical-code mapping).
"""

from __future__ import annotations

from dataclasses import dataclass

from polyport.protocols.reactive import payloads as _schema
from polyport.protocols.reactive.payloads import *  # noqa: F403
from polyport.protocols.reactive.payloads import pack, read_map, read_str
from polyport.protocols.reactivesocket.errors import (
    CANONICAL_ERROR_CODES,
    ErrorData,
    decode_error_data,
    encode_error_data,
)

__all__ = [
    "CANONICAL_ERROR_CODES",
    "ErrorData",
    "SetupData",
    "decode_error_data",
    "decode_setup_data",
    "encode_error_data",
    "encode_setup_data",
]
__all__ += _schema.__all__


# --- SETUP ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetupData:
    user: str | None = None
    password: str | None = None
    context: str | None = None


def encode_setup_data(setup: SetupData) -> bytes:
    obj = {
        k: v
        for k, v in (("user", setup.user), ("password", setup.password), ("context", setup.context))
        if v is not None
    }
    return pack(obj)


def decode_setup_data(data: bytes) -> SetupData:
    """Empty SETUP data means no credentials and the default context."""
    if not data:
        return SetupData()
    what = "SETUP data"
    obj = read_map(data, what)
    return SetupData(
        user=read_str(obj, "user", what, required=False, empty_ok=True),
        password=read_str(obj, "password", what, required=False, empty_ok=True),
        context=read_str(obj, "context", what, required=False),
    )
