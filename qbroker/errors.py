"""Errors: the wire's error element as exceptions, and the registry that maps ids back to types.

A reply's error element is ``{status, id, part, message}``. On the caller's side it becomes an
exception chosen by ``id`` from an explicit registry (never by importing a name from the wire), or the
generic class for its status.
"""

from __future__ import annotations

from typing import ClassVar

# The error element and the results carrying one, importable from here as they always were.
from qbroker.error_element import MAX_ERROR_NAME as MAX_ERROR_NAME
from qbroker.error_element import MAX_ERROR_TEXT as MAX_ERROR_TEXT
from qbroker.error_element import MAX_ERROR_TRACE as MAX_ERROR_TRACE
from qbroker.error_element import Cleared as Cleared
from qbroker.error_element import ErrorInfo as ErrorInfo
from qbroker.error_element import Status as Status
from qbroker.error_element import Warn as Warn


class QBrokerError(Exception):
    """Base of every qbroker error. ``status`` and ``error_id`` are the class's wire identity."""

    status: ClassVar[Status] = "error"
    error_id: ClassVar[str] = "error"
    retryable: ClassVar[bool] = False
    # RQ UNDELIVERED: the request died without being processed (no server, expired in its queue, past its
    # deadline, poison): the caller knows no handler ran it to the end.
    undelivered: ClassVar[bool] = False
    # The protocol: a given (status, id, part) always carries the same message (docs/wire-format.md). A class that
    # names its problem with a fixed ``summary`` sends that as the message and what was particular to the request (a
    # field, a name, a size) as ``detail``. Without one (an application's own RequestFailed(id, message)), the
    # message goes as given: keeping it fixed per id is then the application's part.
    summary: ClassVar[str | None] = None

    def __init__(self, *args: str, part: str = "", trace: str | None = None, detail: str | None = None) -> None:
        # RequestFailed("bad_tile", "tile out of range") or NoServer("no server for x").
        if len(args) >= 2:
            self.id, self.message = args[0], args[1]
        elif len(args) == 1:
            self.id, self.message = self.error_id, args[0]
        else:
            self.id, self.message = self.error_id, ""
        self.part = part
        self.trace = trace
        self.detail = detail
        text = f"{self.status}/{self.id}: {self.message}" if self.message else f"{self.status}/{self.id}"
        super().__init__(f"{text} ({detail})" if detail else text)

    def fixed_message(self) -> str | None:
        return self.summary

    def to_info(self, part: str = "") -> ErrorInfo:
        message, detail, fixed = self.message, self.detail, self.fixed_message()
        if fixed is not None and message != fixed:
            message, detail = fixed, "; ".join(d for d in (message, detail) if d) or None
        return ErrorInfo(
            status=self.status, id=self.id, part=self.part or part, message=message, detail=detail, trace=self.trace
        )


class RequestFailed(QBrokerError):
    """Status ``fail``: cannot succeed without intervention (bad request, wrong version, ...)."""

    status = "fail"
    error_id = "failed"


class RequestError(QBrokerError):
    """Status ``error``: a problem that retrying may or may not fix."""

    status = "error"
    error_id = "error"


class NoServer(RequestFailed):
    error_id = "no_server"
    summary = "no server for the request's name"
    undelivered = True


class InvalidParams(RequestFailed):
    error_id = "invalid_params"
    summary = "the request's parameters are not valid"


class UnknownCommand(RequestFailed):
    error_id = "unknown_command"
    summary = "unknown command"


class BadMessage(RequestFailed):
    """The message itself is malformed: body, version, headers, size or content type."""

    error_id = "bad_message"

    def fixed_message(self) -> str:
        # One class, several ids (bad_header, too_large, ...): the message is fixed per id.
        return f"the message is malformed ({self.id})"


class TimedOutInQueue(RequestError):
    error_id = "queue_timeout"
    summary = "the request timed out waiting in its queue"
    undelivered = True
    retryable = True


class CallTimeout(RequestError):
    error_id = "call_timeout"
    summary = "no reply within the call's timeout"
    retryable = True


class ConnectionLost(RequestError):
    error_id = "connection_lost"
    summary = "the connection to the broker was lost"
    retryable = True


class HandlerCrashed(RequestError):
    error_id = "unhandled"
    summary = "the handler raised an unexpected exception"


class HandlerTimeout(RequestError):
    error_id = "handler_timeout"
    summary = "the handler did not answer within its timeout"
    retryable = True


class ReplyTooLarge(RequestFailed):
    """The handler's result is larger than a message may be; the caller gets this instead."""

    error_id = "reply_too_large"
    summary = "the handler's result is larger than a message may be"


class InternalError(RequestFailed):
    """A message made qbroker's own consumer code fail (not the handler): answered instead of lost."""

    error_id = "internal_error"
    summary = "qbroker could not process the message"


class DeadlinePassed(RequestError):
    """The request's ``deadline`` header had passed when a server took it: it was not run."""

    error_id = "deadline_passed"
    summary = "the request reached its server after its deadline; not run"
    undelivered = True
    retryable = True


class PoisonRequest(RequestFailed):
    """The request crashed or hung its servers too many times; it went to ``dead`` instead of looping."""

    error_id = "poison_request"
    summary = "the request crashed or hung its servers too often; sent to dead"
    undelivered = True


class NotStarted(QBrokerError):
    """The unit is used in the wrong state (e.g. ``call()`` before ``start()``). Never sent."""

    status = "fail"
    error_id = "not_started"


class BrokerUnavailable(QBrokerError):
    """No broker URL could be reached. Never sent."""

    status = "error"
    error_id = "broker_unavailable"
    retryable = True


# Why a broker could not be reached, each its own class so callers can tell them apart (all are
# ``BrokerUnavailable``). Their messages name the URL (password shown as ***), never the password.
class BrokerAuthRefused(BrokerUnavailable):
    """The broker refused the login (ACCESS_REFUSED): wrong user name or password. Not retryable: a wrong
    password does not fix itself."""

    error_id = "broker_auth_refused"
    retryable = False


class BrokerVhostRefused(BrokerUnavailable):
    """The broker refused the vhost (NOT_ALLOWED at connection.open): it does not exist, is down, or the
    user has no permissions on it. Not retryable."""

    error_id = "broker_vhost_refused"
    retryable = False


class BrokerHostUnknown(BrokerUnavailable):
    """The broker's host name does not resolve (DNS)."""

    error_id = "broker_host_unknown"


class BrokerConnectionRefused(BrokerUnavailable):
    """Nothing listens on the broker's host and port."""

    error_id = "broker_connection_refused"


class BrokerTlsFailed(BrokerUnavailable):
    """The TLS handshake failed: ``amqps://`` to a plain port, or a certificate that does not verify."""

    error_id = "broker_tls_failed"


class TopologyMissing(QBrokerError):
    """Shared exchanges or queues of the bus are missing and this account may not declare them (``qbroker
    provision`` does: docs/security.md). Never sent. Retryable: once they are declared, a reconnect succeeds."""

    status = "error"
    error_id = "topology_missing"
    retryable = True


class TopologyConflict(QBrokerError):
    """A shared exchange or queue exists with a setting qbroker cannot work with (an ``rpc`` exchange that is
    not a topic exchange). Never sent."""

    status = "error"
    error_id = "topology_conflict"


_registry: dict[str, type[QBrokerError]] = {}


def register_error(cls: type[QBrokerError]) -> type[QBrokerError]:
    """Let ``cls`` round-trip: a remote error whose id is ``cls.error_id`` is raised as ``cls``."""
    if not (isinstance(cls, type) and issubclass(cls, QBrokerError)):
        raise TypeError("register_error() takes a QBrokerError subclass")
    known = _registry.get(cls.error_id)
    if known is not None and known is not cls:
        raise ValueError(f"error id {cls.error_id!r} is already registered to {known.__qualname__}")
    _registry[cls.error_id] = cls
    return cls


for _cls in (
    NoServer,
    InvalidParams,
    UnknownCommand,
    BadMessage,
    TimedOutInQueue,
    CallTimeout,
    ConnectionLost,
    HandlerCrashed,
    HandlerTimeout,
    ReplyTooLarge,
    InternalError,
    DeadlinePassed,
    PoisonRequest,
):
    register_error(_cls)


def error_from_info(info: ErrorInfo) -> QBrokerError:
    """The exception a caller raises for a reply's error element (status error or fail)."""
    cls = _registry.get(info.id) or _remote_exception_class(info.id)
    if cls is None or cls.status != info.status:
        cls = RequestFailed if info.status == "fail" else RequestError
    return cls(info.id, info.message, part=info.part, trace=info.trace, detail=info.detail)


# -- native exceptions, by allow-list ---------------------------------------------------------------------
# A handler raising one of these (or a registered type) answers ``error`` / ``python.<Name>`` (or the
# registered id), and the caller raises an exception that is both a RequestError and that type, so
# ``except KeyError`` works across the bus. Nothing is ever imported or unpickled by a name from the
# wire: an id outside these tables is a plain RequestError.
NATIVE_EXCEPTIONS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    LookupError,
    ArithmeticError,
    ZeroDivisionError,
    OverflowError,
    TimeoutError,
    PermissionError,
    FileNotFoundError,
    FileExistsError,
    NotImplementedError,
    RuntimeError,
)
_native_ids: dict[type[Exception], str] = {cls: f"python.{cls.__name__}" for cls in NATIVE_EXCEPTIONS}
_remote_classes: dict[str, type[QBrokerError]] = {}


def register_exception(cls: type[Exception], error_id: str) -> type[Exception]:
    """Let a user exception type cross the bus as itself: raised by a handler, answered ``error`` /
    ``error_id``; raised by the caller as an exception that is both a RequestError and ``cls``."""
    if not (isinstance(cls, type) and issubclass(cls, Exception)) or issubclass(cls, QBrokerError):
        raise TypeError("register_exception() takes an Exception subclass that is not a QBrokerError")
    if error_id in _registry or any(i == error_id and c is not cls for c, i in _native_ids.items()):
        raise ValueError(f"error id {error_id!r} is already registered")
    _native_ids[cls] = error_id
    _remote_classes.pop(error_id, None)
    return cls


def native_error(exc: Exception, part: str) -> ErrorInfo | None:
    """The error element for an allowed exception type raised by a handler, or None."""
    for cls in type(exc).__mro__:
        error_id = _native_ids.get(cls)
        if error_id is not None:
            # The message is fixed for (status, id, part); what the exception said is the detail.
            detail = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            return ErrorInfo(
                status="error",
                id=error_id,
                part=part,
                message=f"{cls.__name__} in {part}",
                detail=detail[:2000] or None,
            )
    return None


# Ids qbroker itself sends or raises without a class of their own in the registry (docs/wire-format.md).
LIBRARY_ERROR_IDS = frozenset(
    {
        "error",
        "failed",
        "bad_header",
        "bad_version",
        "bad_body",
        "too_large",
        "rejected",
        "dead_letter",
        "bad_result",
        "bad_request_body",
        "forbidden",
        "not_replayable",
        "not_started",
        "broker_unavailable",
        "broker_auth_refused",
        "broker_vhost_refused",
        "broker_host_unknown",
        "broker_connection_refused",
        "broker_tls_failed",
        "topology_missing",
        "topology_conflict",
    }
)


def is_known_error_id(error_id: str) -> bool:
    """An id this program defines (the library's, a registered error class's, an allowed or registered
    exception type's), as opposed to whatever a peer put on the wire: a bounded set, e.g. for metric labels."""
    return error_id in LIBRARY_ERROR_IDS or error_id in _registry or error_id in _native_ids.values()


def _remote_exception_class(error_id: str) -> type[QBrokerError] | None:
    known = _remote_classes.get(error_id)
    if known is not None:
        return known
    native = next((cls for cls, i in _native_ids.items() if i == error_id), None)
    if native is None:
        return None
    try:
        remote: type[QBrokerError] = type(
            f"Remote{native.__name__}", (RequestError, native), {"error_id": error_id, "__module__": __name__}
        )
    except TypeError:  # a type whose layout cannot be combined: the caller gets a plain RequestError
        return None
    _remote_classes[error_id] = remote
    return remote
