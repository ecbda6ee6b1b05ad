"""The layering rule: core/ owns the database.  Gateway and protocol modules
ask the store (and its monitor) for plain data; they hold no SQL text and
never reach for the connection pool."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OUTER_LAYERS = ("gateway", "protocols")

# SQL keywords as statements start (upper case, as every statement in
# core/sql.py is written), not the English words.
SQL = re.compile(
    r"\b(SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
    r"CREATE\s+(TABLE|DATABASE|INDEX)|DROP\s+(TABLE|DATABASE)|ALTER\s+TABLE|TRUNCATE)\b"
)
POOL_ATTRIBUTES = {"pool", "_pool"}


def layer_violations(source: str) -> list[str]:
    """SQL text in string literals (f-string parts included) and ``.pool`` /
    ``._pool`` attribute access, as ``line: what`` strings."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = SQL.search(node.value)
            if match:
                found.append((node.lineno, f"SQL {match.group(0)!r} in a string"))
        elif isinstance(node, ast.Attribute) and node.attr in POOL_ATTRIBUTES:
            found.append((node.lineno, f"attribute .{node.attr}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def _modules() -> list[Path]:
    return sorted(p for layer in OUTER_LAYERS for p in (REPO / layer).rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_outer_layers_hold_no_sql_and_no_pool(path: Path) -> None:
    assert layer_violations(path.read_text()) == []


def test_the_rule_sees_every_form() -> None:
    source = '''
HEAD = """
SELECT last_position FROM log_head
"""
def ready(store, name):
    store.pool.fetchval("SELECT 1")
    store._pool.execute(f"DELETE FROM subscriptions WHERE name = '{name}'")
    run(f"CREATE DATABASE {name}")
    return "UPDATE users SET contexts = $2"
'''
    assert layer_violations(source) == [
        "2: SQL 'SELECT' in a string",
        "6: SQL 'SELECT' in a string",
        "6: attribute .pool",
        "7: SQL 'DELETE FROM' in a string",
        "7: attribute ._pool",
        "8: SQL 'CREATE DATABASE' in a string",
        "9: SQL 'UPDATE users SET' in a string",
    ]


def test_the_rule_leaves_prose_alone() -> None:
    source = '''
"""Select a stream, then update the checkpoint and delete the group."""
def f(session):
    return session.select("Select an option", "an INSERT key")
'''
    assert layer_violations(source) == []
