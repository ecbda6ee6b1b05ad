"""Statements built from values rather than bound parameters (psql -c takes none)."""

from __future__ import annotations

from polyport.core import sql


def test_database_bootstrap_statements_quote_the_name() -> None:
    assert sql.database_exists("polyport") == (
        "SELECT 1 FROM pg_database WHERE datname='polyport'"
    )
    assert sql.create_database("polyport") == 'CREATE DATABASE "polyport"'
    assert sql.database_exists("it's") == "SELECT 1 FROM pg_database WHERE datname='it''s'"
    assert sql.create_database('a"b') == 'CREATE DATABASE "a""b"'
