"""What a handler knows about the message it is handling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from structlog.typing import FilteringBoundLogger

from qbroker.envelope import Header
from qbroker.errors import ErrorInfo


@dataclass
class RequestContext:
    """Passed to a handler that declares a parameter annotated ``RequestContext``."""

    header: Header
    kind: str
    logger: FilteringBoundLogger = field(repr=False)
    message: AbstractIncomingMessage | None = field(default=None, repr=False)
    detached: bool = False
    # An alert's error element, when the sender attached one (e.g. status ``ok``: an error state is over).
    error: ErrorInfo | None = None
    # The endpoint name, or the listener's alert name: what metrics and spans are labelled with.
    part: str | None = None
    # A middleware re-published the request (a retry, a redelivery count): that copy gets the one reply.
    handed_on: bool = False
    _bound: FilteringBoundLogger | None = field(default=None, repr=False)

    @property
    def log(self) -> FilteringBoundLogger:
        """The unit's logger bound with this message's name, kind and correlation id (bound on first use:
        most requests never log)."""
        if self._bound is None:
            self._bound = self.logger.bind(name=self.header.name, kind=self.kind, correlation_id=self.header.message_id)
        return self._bound

    @property
    def name(self) -> str | None:
        return self.header.name

    @property
    def message_id(self) -> str | None:
        return self.header.message_id

    @property
    def correlation_id(self) -> str | None:
        return self.header.correlation_id

    @property
    def reply_to(self) -> str | None:
        return self.header.reply_to

    @property
    def user_id(self) -> str | None:
        """The sender's broker account as RabbitMQ validated it (None if the sender did not set it)."""
        return self.header.user_id

    @property
    def app_id(self) -> str | None:
        return self.header.app_id

    @property
    def debug(self) -> bool:
        return self.header.debug

    @property
    def deadline(self) -> float | None:
        return self.header.deadline

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.message.headers or {}) if self.message is not None else {}

    async def detach(self) -> None:
        """Acknowledge the request now, freeing its prefetch slot for a long wait.

        The reply is still sent when the handler returns. If this unit dies before then, the request
        is not redelivered: the caller sees its own timeout.
        """
        if self.detached or self.message is None or self.kind != "rpc":
            return  # an alert is acked once all its listeners ran
        self.detached = True
        await self.message.ack()
