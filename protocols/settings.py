"""One way for every adapter to read its limits from the gateway's settings.

Every protocol package declares its limits as one frozen dataclass with
defaults, ``Limits`` in its ``limits.py``, on :class:`ProtocolLimits`, and
every user builds it the same way: ``Limits.from_settings(settings)`` with the
gateway's settings (``gw.settings``, also ``SessionContext.settings``).  Each field
is read from the setting ``<protocol>_<field>`` (configuration ``extra`` keys,
TOML, environment) or, for fields named in ``shared``, from the gateway-wide
setting of the same name (``max_event_bytes``, ``idle_timeout``, …) when the
protocol-specific key is absent.  A field whose documented key is spelled
otherwise names it in its metadata: ``field(default=…, metadata={"setting":
"segment_max_block_bytes"})``.  Values may arrive as text; they are converted
to the field's declared type.  Range checks and derived values belong in the
dataclass's ``__post_init__``, so they hold however the object is built.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Self, TypeVar

T = TypeVar("T")


def _convert(name: str, raw: Any, annotation: Any) -> Any:
    if raw is None:
        return None
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        # ``float | None``: the first non-None member decides the conversion.
        annotation = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple:
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        return tuple(str(x).strip() for x in items if str(x).strip())
    if annotation is bool:
        if isinstance(raw, str):
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"setting {name}: expected true or false, got {raw!r}")
        return bool(raw)
    if annotation in (int, float, str):
        try:
            return annotation(raw)
        except (TypeError, ValueError):
            kind = annotation.__name__
            raise ValueError(f"setting {name}: expected {kind}, got {raw!r}") from None
    return raw


def settings_from(
    cls: type[T],
    settings: Mapping[str, Any],
    *,
    prefix: str,
    shared: Iterable[str] = (),
) -> T:
    """Build ``cls`` from ``settings``: ``<prefix>_<field>``, else the shared
    gateway-wide key for fields listed in ``shared``, else the field's default."""
    shared = frozenset(shared)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        key = f.metadata.get("setting", f"{prefix}_{f.name}")
        raw = settings.get(key)
        if raw is None and f.name in shared:
            key, raw = f.name, settings.get(f.name)
        if raw is None:
            continue
        values[f.name] = _convert(key, raw, hints[f.name])
    return cls(**values)


class ProtocolLimits:
    """The base of every protocol package's ``Limits`` dataclass.

    A package names its settings prefix (``protocol``) and the fields that
    fall back to the gateway-wide key of the same name (``shared_settings``);
    :meth:`from_settings` is then the one way to build it.
    """

    __slots__ = ()

    protocol: ClassVar[str] = ""
    shared_settings: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Self:
        """The limits from the gateway's settings (:func:`settings_from`)."""
        return settings_from(cls, settings, prefix=cls.protocol, shared=cls.shared_settings)
