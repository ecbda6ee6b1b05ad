"""Alembic environment and revisions for the polyport schema."""
