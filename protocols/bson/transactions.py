"""STARTTX / EMIT with sessID / COMMITTX / ABORTTX of one BSON connection.

The connection's :class:`~polyport.protocols.bson.state.TransactionTable` says
which sessIDs are open (and answers misuse with a non-fatal RequestError);
:class:`Transactions` keeps what they hold: the appends buffered until
COMMITTX, within the per-connection caps.  Nothing here waits or writes: the
session sends the replies and runs the commit's append batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyport.core.commands import Append, AppendBatch
from polyport.core.errors import Busy, Malformed, PolyportError, TooLarge
from polyport.protocols.bson.errors import RequestError, error_response
from polyport.protocols.bson.frames import PROTOCOL, Response
from polyport.protocols.bson.replies import OK
from polyport.protocols.bson.state import TransactionTable


@dataclass(slots=True)
class Transaction:
    appends: list[Append] = field(default_factory=list)
    events: int = 0
    size: int = 0
    # The first rejected EMIT dooms the transaction: COMMITTX then fails with it,
    # so a client that pipelines EMITs never commits half a transaction.
    failure: PolyportError | None = None

    def doom(self, exc: PolyportError) -> None:
        if self.failure is None:
            self.failure = exc


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A COMMITTX to carry out: one batch, holding ``size`` event bytes."""

    batch: AppendBatch
    size: int


class Transactions:
    """Open transactions of one connection and the events they buffer."""

    def __init__(
        self, table: TransactionTable, *, max_open: int, max_events: int, max_bytes: int
    ) -> None:
        self.table = table
        self.max_open = max_open
        self.max_events = max_events
        # Event bytes buffered in all open transactions of the connection.
        self.max_bytes = max_bytes
        self._open: dict[int, Transaction] = {}
        self._bytes = 0

    def get(self, sess_id: int | None) -> Transaction | None:
        """The open transaction an EMIT's sessID names; None means a plain append."""
        return self._open.get(sess_id) if sess_id is not None else None

    def start(self, sess_id: int) -> Response:
        try:
            if not self.table.is_open(sess_id) and len(self._open) >= self.max_open:
                raise Busy(f"STARTTX: at most {self.max_open} open transactions per connection")
            self.table.start(sess_id)
        except (RequestError, PolyportError) as exc:
            return error_response(exc)
        self._open[sess_id] = Transaction()
        return OK

    def buffer(self, tx: Transaction, append: Append, size: int) -> None:
        """Hold an EMIT's append until COMMITTX; raises if a cap would be passed."""
        if tx.failure is not None:
            raise Malformed(
                f"EMIT: the transaction already failed ({tx.failure.code}); "
                "it can only be aborted"
            )
        if tx.events + 1 > self.max_events:
            raise TooLarge(f"EMIT: a transaction holds at most {self.max_events} events")
        if self._bytes + size > self.max_bytes:
            raise TooLarge(
                f"EMIT: open transactions of this connection would exceed {self.max_bytes} bytes"
            )
        last = tx.appends[-1] if tx.appends else None
        if last is not None and last.stream == append.stream:
            # Consecutive events of one stream become one append.
            tx.appends[-1] = Append(
                last.context, last.stream, last.events + append.events, origin=PROTOCOL
            )
        else:
            tx.appends.append(append)
        tx.events += 1
        tx.size += size
        self._bytes += size

    def abort(self, sess_id: int) -> Response:
        try:
            self._finish(sess_id, commit=False)
        except RequestError as exc:
            return error_response(exc)
        return OK

    def commit(self, sess_id: int) -> Response | PendingCommit:
        """The reply when it is decided now, else the batch to append."""
        try:
            tx = self._finish(sess_id, commit=True)
        except RequestError as exc:
            return error_response(exc)
        if tx.failure is not None:
            return Response(
                ok=False,
                err_code=tx.failure.code,
                err_msg=f"COMMITTX: transaction {sess_id} not committed, an EMIT in it "
                f"was rejected: {tx.failure.message}",
            )
        if not tx.appends:
            return OK
        return PendingCommit(AppendBatch(tuple(tx.appends)), tx.size)

    def clear(self) -> None:
        """The connection is gone: drop every open transaction."""
        self._open.clear()
        self.table.clear()

    def _finish(self, sess_id: int, commit: bool) -> Transaction:
        if commit:
            self.table.commit(sess_id)
        else:
            self.table.abort(sess_id)
        tx = self._open.pop(sess_id)
        self._bytes -= tx.size
        return tx
