"""The canonical event store: commands, events, errors, storage and
subscriptions on PostgreSQL.  Knows no wire protocol."""
