"""The layering rule: core/ owns the database.  Gateway, protocol and
pipeline modules ask the store (and its monitor, or the pipeline's
connection in core.pipeline_db) for plain data; they hold no SQL text, never
reach for the connection pool and never import the driver, whose errors core
translates (core.db)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Where SQL and the driver belong: core/, and the schema's revisions.  Every
# other installed folder (pyproject.toml's package-dir: a new one is checked
# without an edit here) is an outer layer; bench/ and tests/ are not
# installed (bench/ measures against raw asyncpg on purpose).
DATABASE_LAYERS = ("core", "migrations")
DRIVER = "asyncpg"

# SQL keywords as statements start (upper case, as every statement in
# core/sql.py is written), not the English words.
SQL = re.compile(
    r"\b(SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
    r"CREATE\s+(TABLE|DATABASE|INDEX)|DROP\s+(TABLE|DATABASE)|ALTER\s+TABLE|TRUNCATE|"
    r"ON\s+CONFLICT|FOR\s+UPDATE|RETURNING|WHERE)\b"
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


def outer_layers() -> list[str]:
    """The installed source folders, less the database layers."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = config["tool"]["setuptools"]["package-dir"].values()
    return sorted(f for f in folders if f.split("/")[0] not in DATABASE_LAYERS)


def _modules() -> list[Path]:
    return sorted(p for layer in outer_layers() for p in (REPO / layer).rglob("*.py"))


def test_every_package_folder_is_checked() -> None:
    # A new folder of code is checked without an edit here; these three must be.
    assert {"gateway", "protocols", "pipeline"} <= set(outer_layers())


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
PARTS = "position, body"
UPSERT = f"VALUES ($1) ON CONFLICT (job) DO NOTHING"
LOCK = "SELECT 1 FOR UPDATE"
'''
    assert layer_violations(source) == [
        "2: SQL 'SELECT' in a string",
        "6: SQL 'SELECT' in a string",
        "6: attribute .pool",
        "7: SQL 'DELETE FROM' in a string",
        "7: attribute ._pool",
        "8: SQL 'CREATE DATABASE' in a string",
        "9: SQL 'UPDATE users SET' in a string",
        "11: SQL 'ON CONFLICT' in a string",
        "12: SQL 'SELECT' in a string",
    ]


def driver_imports(source: str) -> list[str]:
    """Imports of the database driver, as ``line: what`` strings."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.split(".")[0] == DRIVER]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == DRIVER:
            found.append((node.lineno, f"import from {node.module}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_outer_layers_import_no_driver(path: Path) -> None:
    # core.db turns every driver error into core's; nothing above handles asyncpg's.
    assert driver_imports(path.read_text()) == []


def test_the_driver_rule_sees_every_form() -> None:
    source = '''
import asyncpg
import asyncpg.exceptions as e
from asyncpg import PostgresError
def f():
    from asyncpg.pool import Pool
import asyncpgx
'''
    assert driver_imports(source) == [
        "2: import asyncpg",
        "3: import asyncpg.exceptions",
        "4: import from asyncpg",
        "6: import from asyncpg.pool",
    ]


def test_the_rule_leaves_prose_alone() -> None:
    source = '''
"""Select a stream, then update the checkpoint and delete the group."""
def f(session):
    return session.select("Select an option", "an INSERT key")
'''
    assert layer_violations(source) == []


# --- the trust boundary: adapters reach storage only through a Tenant ---------------

# protocols/session.py is the seam: SessionContext keeps the store private and
# hands adapters Tenants.  (Res01's listener, in gateway/, makes each
# request's Tenant from the principal its ZAP login gave.)
TRUST_BOUNDARY_EXEMPT = frozenset({"protocols/session.py"})
STORE_MODULE = "polyport.core.store"
STORE_ATTRIBUTES = {"store", "_store", "store_for_res01"}


def store_violations(source: str) -> list[str]:
    """Imports of ``polyport.core.store`` (or of ``EventStore`` from anywhere)
    and ``.store`` / ``._store`` attribute access, as ``line: what``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names = {a.name for a in node.names}
            package, _, module = STORE_MODULE.rpartition(".")
            if (node.module == STORE_MODULE or "EventStore" in names
                    or (node.module == package and module in names)):
                found.append((node.lineno, f"import from {node.module}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == STORE_MODULE or alias.name.startswith(STORE_MODULE + "."):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.Attribute) and node.attr in STORE_ATTRIBUTES:
            found.append((node.lineno, f"attribute .{node.attr}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def _protocol_modules() -> list[Path]:
    return sorted(
        p for p in (REPO / "protocols").rglob("*.py")
        if str(p.relative_to(REPO)) not in TRUST_BOUNDARY_EXEMPT
    )


@pytest.mark.parametrize("path", _protocol_modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_protocol_adapters_reach_storage_only_through_a_tenant(path: Path) -> None:
    assert store_violations(path.read_text()) == []


def test_the_exemptions_exist() -> None:
    # A renamed or removed module must not leave a stale exemption behind.
    for name in TRUST_BOUNDARY_EXEMPT:
        assert (REPO / name).is_file(), name


def test_the_store_rule_sees_every_form() -> None:
    source = '''
import polyport.core.store
from polyport.core.store import StoreConfig
from polyport.core import store
from somewhere import EventStore
def serve(ctx, self):
    ctx.store.append(x)
    self._store = ctx._store
    return ctx.store_for_res01, self._store_appends, ctx.restore
'''
    assert store_violations(source) == [
        "2: import polyport.core.store",
        "3: import from polyport.core.store",
        "4: import from polyport.core",
        "5: import from somewhere",
        "7: attribute .store",
        "8: attribute ._store",
        "8: attribute ._store",
        "9: attribute .store_for_res01",
    ]
