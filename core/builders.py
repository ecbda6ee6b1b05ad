"""Building frozen dataclasses without their ``__init__``, for the paths that
make one object per event.

A frozen dataclass's ``__init__`` sets every field through
``object.__setattr__`` (its own ``__setattr__`` refuses), and keyword
arguments cost more again: an :class:`~core.commands.AppendResult` took
3.6 µs to build by keywords and 2.6 µs positionally on the 2-core machine,
and 1.2 µs through the slots' own descriptors, which is what
:func:`frozen_builder` generates.  The commit chain builds one per append
it answers, on the one core every commit goes through.

A builder skips ``__post_init__``: its caller hands over values already in
the form the class keeps (``EventData``'s headers frozen, its body
``bytes``, its client time zone-aware).  Values of our own take this path
as they are (the planner's, the database's, another process of this
gateway's).  What a client sends takes it only through a function that
first puts it in that form as ``__post_init__`` would
(:func:`core.events.event_data`, MicroMsg2's ``build_frame``), or into a
class that has no ``__post_init__`` (the BSON frames), each held to
``__init__`` by a test.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def frozen_builder(cls: type[T]) -> Callable[..., T]:
    """A function taking every field of ``cls`` positionally, in declaration
    order, and returning the instance ``cls(*values)`` would, without
    running ``__init__`` or ``__post_init__``.  ``cls`` must be a frozen
    dataclass with slots (a slot descriptor sets each field)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen dataclass with slots")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    # The generated names are dunders, which no field of ours is named
    # like (as dataclasses names __dataclass_self__): a field called "obj"
    # or "_new" must not shadow them.
    namespace: dict[str, Any] = {"__fb_new__": object.__new__, "__fb_cls__": cls}
    for i, name in enumerate(names):
        namespace[f"__fb_set{i}__"] = getattr(cls, name).__set__
    # Generated, as dataclasses generates __init__: a loop over the setters
    # costs 2.0 µs per AppendResult against 1.2 µs for straight-line calls.
    source = "".join([
        f"def build({', '.join(names)}):\n",
        "    __fb_obj__ = __fb_new__(__fb_cls__)\n",
        *(f"    __fb_set{i}__(__fb_obj__, {name})\n" for i, name in enumerate(names)),
        "    return __fb_obj__\n",
    ])
    exec(source, namespace)  # the source holds field names only
    build: Callable[..., T] = namespace["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build


_new = object.__new__
_UUID = uuid.UUID
# The slot descriptors themselves (UUID's own __setattr__ refuses).
_set_uuid_int = vars(uuid.UUID)["int"].__set__
_set_uuid_safe = vars(uuid.UUID)["is_safe"].__set__
_UNKNOWN = uuid.SafeUUID.unknown


def uuid_from_int(value: int) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a ``value`` known to be in range, through
    the slots' own descriptors: 0.4 against 0.9 µs on the 2-core machine.
    Once per event id the commit chain decodes, and per id a worker
    generates (core.events.new_event_id)."""
    u = _new(_UUID)
    _set_uuid_int(u, value)
    _set_uuid_safe(u, _UNKNOWN)
    return u


def uuid_from_bytes(value: bytes) -> uuid.UUID:
    """``uuid.UUID(bytes=value)`` for 16 bytes another process of this
    gateway packed (a UUID's ``.bytes``): no length check."""
    return uuid_from_int(int.from_bytes(value))
