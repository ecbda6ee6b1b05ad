"""QUERY / QUERYACK and QUERYRESULT sending of one BSON connection.

QUERYRESPONSE promises ``numResults``; a task per query then sends that many
QUERYRESULT frames, at most the query window ahead of the peer's QUERYACKs.
A promise that cannot be kept (binder changed, storage failed) has no frame
of its own, so it ends the connection with the fatal RESPONSE.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from polyport.core.binders import BinderQuery
from polyport.core.errors import Busy, Malformed, PolyportError
from polyport.protocols.bson.errors import ProtocolError, error_response, log
from polyport.protocols.bson.frames import Frame, Query, QueryAck, QueryResponse, QueryResult
from polyport.protocols.bson.replies import done

if TYPE_CHECKING:
    from polyport.protocols.bson.adapter import BsonSession


@dataclass(eq=False, slots=True)
class _Query:
    query_id: int
    # The core's result, between the QUERYRESPONSE and the result task.
    result: BinderQuery | None = None
    task: asyncio.Task[None] | None = None
    acked: asyncio.Event = field(default_factory=asyncio.Event)


class Queries:
    """The active queries of one session, by queryID."""

    def __init__(self, session: BsonSession) -> None:
        self.session = session
        self._queries: dict[int, _Query] = {}

    async def query(self, frame: Query) -> None:
        session = self.session
        qid = frame.query_id
        if qid in self._queries:
            exc: PolyportError = Malformed(f"QUERY: queryID {qid} is still active")
            await session.reply(done(error_response(exc)))
            return
        limit = session.limits.max_queries
        if len(self._queries) >= limit:
            exc = Busy(f"QUERY: at most {limit} queries at a time")
            await session.reply(done(error_response(exc)))
            return
        q = _Query(qid)
        self._queries[qid] = q
        task = session.spawn(self._run(q, frame))
        await session.reply(task, after=lambda reply: self._start_results(q, reply))

    def ack(self, frame: QueryAck) -> None:
        # The connection has already counted it against the window.
        q = self._queries.get(frame.query_id)
        if q is not None:
            q.acked.set()

    def cancel_all(self) -> None:
        for q in self._queries.values():
            if q.task is not None:
                q.task.cancel()
        self._queries.clear()

    async def _run(self, q: _Query, frame: Query) -> Frame:
        try:
            if not frame.binder:
                raise Malformed("QUERY: 'binder' must not be empty")
            q.result = await self.session.tenant.query(frame.binder, frame.matcher)
        except Exception as exc:  # noqa: BLE001 - translated for the client
            return error_response(exc)
        return QueryResponse(query_id=frame.query_id, num_results=q.result.count)

    def _start_results(self, q: _Query, reply: Frame) -> None:
        result, q.result = q.result, None
        mine = self._queries.get(q.query_id) is q
        if not mine or result is None or not isinstance(reply, QueryResponse):
            if mine:
                del self._queries[q.query_id]
            return
        if reply.num_results == 0:
            del self._queries[q.query_id]
            return
        q.task = self.session.spawn(self._send_results(q, result, reply.num_results))

    async def _send_results(self, q: _Query, result: BinderQuery, count: int) -> None:
        session = self.session
        conn = session.conn
        qid = q.query_id
        sent = 0
        try:
            async for doc in result:
                if sent == count:
                    break
                while not conn.can_send_query_result(qid):
                    # At most ``bson_query_window`` unacknowledged: wait for QUERYACK.
                    q.acked.clear()
                    await q.acked.wait()
                session.ctx.stats.frames_out += 1
                await session.out.send(conn.send(QueryResult(query_id=qid, result=doc)))
                sent += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged; the session goes on
            log.warning(
                "%s: QUERY %d failed after %d results: %s", session.out.peer, qid, sent, exc
            )
        finally:
            if self._queries.get(qid) is q:
                del self._queries[qid]
        if sent < count and not session.closing:
            # numResults was promised and cannot be kept (the binder was
            # dropped or rebuilt meanwhile, or storage failed): there is no
            # frame to say so but the fatal RESPONSE.
            await session.fatal(
                ProtocolError(
                    f"QUERY {qid}: only {sent} of {count} results could be sent "
                    "(binder changed or storage failed)",
                    code="storage_unavailable",
                )
            )
