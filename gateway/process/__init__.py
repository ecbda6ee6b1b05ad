"""The processes of ``polyport serve`` and what they stand on: the supervisor,
its workers and the commit chain, the event loop, logging, fatal errors and
announcements, the rights of open connections, and the database they find or
start under the data directory."""
