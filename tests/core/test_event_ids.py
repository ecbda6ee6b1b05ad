"""Fresh event ids (core/events.py): random version-4 UUIDs drawn from a
buffer of the OS's random bytes."""

from __future__ import annotations

import os
import uuid

from polyport.core.events import EventData, new_event_id


def test_ids_are_version_4_and_distinct() -> None:
    ids = [new_event_id() for _ in range(5000)]  # many refills of the buffer
    assert len(set(ids)) == len(ids)
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in ids)
    assert EventData(type="t", body=b"").event_id.version == 4


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_event_id()  # the buffer holds unused bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, new_event_id().bytes)
        finally:
            os._exit(0)
    os.close(write)
    child = uuid.UUID(bytes=os.read(read, 16))
    os.close(read)
    os.waitpid(pid, 0)
    assert child != new_event_id()

