"""The wire's error element (``ErrorInfo``: ``{status, id, part, message}``, in the AMQP header ``error``), and
the handler results that carry one without failing: ``Warn`` (status ``warn``) and ``Cleared`` (status ``ok``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

Status = Literal["ok", "warn", "error", "fail"]


# The error element travels in the AMQP headers, which must fit one frame (frame_max, 128 KiB by default): a
# larger one makes RabbitMQ close the publisher's whole connection (FRAME_ERROR frame_too_large). Its texts
# may quote a request (an unknown command's name, a forbidden field's), so each is cut on the way out (at most
# 4 bytes a character: message, detail and trace stay under 100 KB together).
MAX_ERROR_TEXT = 4000
MAX_ERROR_TRACE = 16000
MAX_ERROR_NAME = 255  # id and part


def _cut(text: str | None, limit: int, *, keep_end: bool = False) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


class ErrorInfo(BaseModel):
    """The error element of a message (carried in the AMQP header ``error``)."""

    status: Status
    id: str
    part: str = ""
    message: str = ""
    # What was particular to this request (a given status, id and part always carry the same message, so the
    # specifics travel apart from it). Optional: other clients of the protocol ignore it (docs/wire-format.md,
    # "Error element").
    detail: str | None = None
    trace: str | None = None

    def header(self) -> dict[str, Any]:
        """The element as the ``error`` header: every text cut to fit a frame (a traceback keeps its end)."""
        return {
            key: value
            for key, value in (
                ("status", self.status),
                ("id", _cut(self.id, MAX_ERROR_NAME)),
                ("part", _cut(self.part, MAX_ERROR_NAME)),
                ("message", _cut(self.message, MAX_ERROR_TEXT)),
                ("detail", _cut(self.detail, MAX_ERROR_TEXT)),
                ("trace", _cut(self.trace, MAX_ERROR_TRACE, keep_end=True)),
            )
            if value is not None
        }


class Warn:
    """Returned by a handler: the request succeeded with a warning (status ``warn``)."""

    __slots__ = ("result", "id", "message", "part")

    def __init__(self, result: Any, id: str = "warning", message: str = "", part: str = "") -> None:
        self.result = result
        self.id = id
        self.message = message
        self.part = part

    def to_info(self, part: str = "") -> ErrorInfo:
        return ErrorInfo(status="warn", id=self.id, part=self.part or part, message=self.message)


class Cleared:
    """Returned by a handler: the request succeeded *and* the error state ``id`` (of ``part``) reported
    earlier is over. The reply carries the error element with status ``ok``
    (docs/semantics.md, "Status `ok`"). ``Reply.cleared`` shows it to the caller."""

    __slots__ = ("result", "id", "message", "part")

    def __init__(self, result: Any, id: str, message: str = "", part: str = "") -> None:
        self.result = result
        self.id = id
        self.message = message
        self.part = part

    def to_info(self, part: str = "") -> ErrorInfo:
        return ErrorInfo(status="ok", id=self.id, part=self.part or part, message=self.message)
