"""MongoDB-subset matchers: equality, ``$eq $ne $gt $gte $lt $lte $in $nin
$exists $and $or``, dotted paths.

Semantics follow MongoDB where it matters to users: a field holding an array
matches an equality (or ``$in``) when any element does; ``$ne``/``$nin``
match missing fields; comparisons only hold between values of the same kind
(numbers with numbers, strings with strings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bson import json_util

from polyport.core.errors import Malformed
from polyport.core.events import RecordedEvent
from polyport.core.limits import DEFAULT_MATCHER_LIMITS, MatcherLimits

Predicate = Callable[[Mapping[str, Any]], bool]

_MISSING = object()
_COMPARISONS = {"$gt", "$gte", "$lt", "$lte"}
_OPERATORS = {"$eq", "$ne", "$in", "$nin", "$exists", *_COMPARISONS}


def _resolve(doc: Any, path: str) -> Any:
    cur = doc
    for part in path.split("."):
        if isinstance(cur, Mapping):
            cur = cur.get(part, _MISSING)
        elif isinstance(cur, list) and part.isdigit():
            idx = int(part)
            cur = cur[idx] if idx < len(cur) else _MISSING
        else:
            return _MISSING
        if cur is _MISSING:
            return _MISSING
    return cur


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    return type(v).__name__


def _equal(value: Any, target: Any) -> bool:
    if value is _MISSING:
        return target is None
    if _kind(value) == _kind(target) and value == target:
        return True
    return isinstance(value, list) and any(_equal(v, target) for v in value)


def _compare(op: str, value: Any, target: Any) -> bool:
    if value is _MISSING:
        return False
    if isinstance(value, list):
        return any(_compare(op, v, target) for v in value)
    if _kind(value) != _kind(target) or _kind(value) not in ("number", "string"):
        return False
    if op == "$gt":
        return bool(value > target)
    if op == "$gte":
        return bool(value >= target)
    if op == "$lt":
        return bool(value < target)
    return bool(value <= target)


def _field_predicate(path: str, cond: Any) -> Predicate:
    if isinstance(cond, Mapping) and cond and all(str(k).startswith("$") for k in cond):
        checks: list[Predicate] = []
        for op, arg in cond.items():
            if op not in _OPERATORS:
                raise Malformed(f"unsupported matcher operator {op!r} on {path!r}")
            checks.append(_operator(path, op, arg))
        return lambda doc: all(c(doc) for c in checks)
    return lambda doc: _equal(_resolve(doc, path), cond)


def _operator(path: str, op: str, arg: Any) -> Predicate:
    if op == "$eq":
        return lambda doc: _equal(_resolve(doc, path), arg)
    if op == "$ne":
        return lambda doc: not _equal(_resolve(doc, path), arg)
    if op in ("$in", "$nin"):
        if not isinstance(arg, list):
            raise Malformed(f"{op} on {path!r} needs an array")
        values = list(arg)
        if op == "$in":
            return lambda doc: any(_equal(_resolve(doc, path), v) for v in values)
        return lambda doc: not any(_equal(_resolve(doc, path), v) for v in values)
    if op == "$exists":
        want = bool(arg)
        return lambda doc: (_resolve(doc, path) is not _MISSING) == want
    return lambda doc: _compare(op, _resolve(doc, path), arg)


def _all_of(preds: list[Predicate]) -> Predicate:
    return lambda doc: all(p(doc) for p in preds)


def _any_of(preds: list[Predicate]) -> Predicate:
    return lambda doc: any(p(doc) for p in preds)


def event_matcher(spec: Mapping[str, Any]) -> Callable[[RecordedEvent], bool]:
    """A matcher over an event's body document (what BSON ``matcher`` and
    persisted durable subscriptions mean by "the event fields")."""
    from polyport.core.bodies import event_document

    predicate = compile_matcher(spec)
    return lambda ev: predicate(event_document(ev))


def check_matcher_size(spec: Mapping[str, Any], limits: MatcherLimits) -> None:
    """Refuse a matcher too deep or too big to evaluate safely, walking it
    without recursion: a predicate compiled from it can then never recurse
    deeper than ``limits.max_depth`` on an event."""
    stack: list[tuple[Any, int]] = [(spec, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise Malformed(f"matcher has more than {limits.max_nodes} parts (max_matcher_nodes)")
        if isinstance(value, Mapping):
            children: Any = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if depth > limits.max_depth:
            raise Malformed(
                f"matcher nests documents and arrays deeper than {limits.max_depth} levels "
                "(max_matcher_depth)"
            )
        stack.extend((c, depth + 1) for c in children)
    try:
        size = len(json_util.dumps(spec).encode("utf-8"))
    except (TypeError, ValueError):
        size = len(repr(spec))
    if size > limits.max_bytes:
        raise Malformed(
            f"matcher of {size} bytes exceeds the limit of {limits.max_bytes} bytes "
            "(max_matcher_bytes)"
        )


def compile_matcher(
    spec: Mapping[str, Any] | None, limits: MatcherLimits = DEFAULT_MATCHER_LIMITS
) -> Predicate:
    """Compile a matcher document into a predicate over documents.
    Raises :class:`~core.errors.Malformed` with the offending part, or the
    limit it breaks."""
    if spec is None:
        return lambda doc: True
    if not isinstance(spec, Mapping):
        raise Malformed("a matcher must be a document")
    check_matcher_size(spec, limits)
    return _compile(spec)


def _compile(spec: Mapping[str, Any]) -> Predicate:
    if not isinstance(spec, Mapping):
        raise Malformed("a matcher must be a document")
    parts: list[Predicate] = []
    for key, cond in spec.items():
        if key in ("$and", "$or"):
            if not isinstance(cond, list) or not cond:
                raise Malformed(f"{key} needs a non-empty array of matchers")
            subs = [_compile(c) for c in cond]
            parts.append(_all_of(subs) if key == "$and" else _any_of(subs))
        elif isinstance(key, str) and key.startswith("$"):
            raise Malformed(f"unsupported top-level matcher operator {key!r}")
        else:
            parts.append(_field_predicate(str(key), cond))
    return lambda doc: all(p(doc) for p in parts)
