"""Alembic environment and revisions for the polyport schema."""

# The newest revision in versions/: the schema this code runs against.  Every
# gateway process checks the database against it at start, without loading
# Alembic to find it (core/migrate.py says why); a new revision moves it, and
# tests/core/test_migrations.py fails until it does.
HEAD_REVISION = "0011"
