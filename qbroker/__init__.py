"""qbroker: an asyncio message bus for RabbitMQ implementing the QBroker AMQP structure.

The public names below are loaded on first use (PEP 562), so importing a submodule such as the
``qbroker`` console script's ``qbroker.cli.main`` does not pay for aio-pika, pydantic-settings and
structlog before they are needed (``qbroker --help`` stays fast). ``from qbroker import Unit`` works
exactly as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The library's version, read by the build (pyproject.toml: dynamic), `--version` and <program>_build_info.
__version__ = "0.3.0"

if TYPE_CHECKING:
    from qbroker.config import Config
    from qbroker.context import RequestContext
    from qbroker.errors import (
        BadMessage,
        BrokerAuthRefused,
        BrokerConnectionRefused,
        BrokerHostUnknown,
        BrokerTlsFailed,
        BrokerUnavailable,
        BrokerVhostRefused,
        CallTimeout,
        Cleared,
        ConnectionLost,
        DeadlinePassed,
        ErrorInfo,
        HandlerCrashed,
        HandlerTimeout,
        InternalError,
        InvalidParams,
        NoServer,
        NotStarted,
        PoisonRequest,
        QBrokerError,
        ReplyTooLarge,
        RequestError,
        RequestFailed,
        TimedOutInQueue,
        UnknownCommand,
        Warn,
        register_error,
        register_exception,
    )
    from qbroker.replies import Reply
    from qbroker.runner import run, serve
    from qbroker.unit import Unit

_ERRORS = (
    "BadMessage",
    "BrokerUnavailable",
    "CallTimeout",
    "ConnectionLost",
    "ErrorInfo",
    "HandlerCrashed",
    "HandlerTimeout",
    "InvalidParams",
    "NoServer",
    "NotStarted",
    "QBrokerError",
    "RequestError",
    "RequestFailed",
    "TimedOutInQueue",
    "UnknownCommand",
    "Warn",
    "register_error",
    "DeadlinePassed",
    "InternalError",
    "PoisonRequest",
    "ReplyTooLarge",
    "register_exception",
    "Cleared",
    "BrokerAuthRefused",
    "BrokerVhostRefused",
    "BrokerHostUnknown",
    "BrokerConnectionRefused",
    "BrokerTlsFailed",
)
_WHERE = {
    "Config": "qbroker.config",
    "RequestContext": "qbroker.context",
    "Reply": "qbroker.replies",
    "Unit": "qbroker.unit",
    "run": "qbroker.runner",
    "serve": "qbroker.runner",
    **{name: "qbroker.errors" for name in _ERRORS},
}

__all__ = [
    "run",
    "serve",
    "BadMessage",
    "BrokerUnavailable",
    "CallTimeout",
    "Config",
    "ConnectionLost",
    "ErrorInfo",
    "HandlerCrashed",
    "HandlerTimeout",
    "InvalidParams",
    "NoServer",
    "NotStarted",
    "QBrokerError",
    "Reply",
    "RequestContext",
    "RequestError",
    "RequestFailed",
    "TimedOutInQueue",
    "UnknownCommand",
    "Unit",
    "Warn",
    "register_error",
    "DeadlinePassed",
    "InternalError",
    "PoisonRequest",
    "ReplyTooLarge",
    "register_exception",
    "Cleared",
    "BrokerAuthRefused",
    "BrokerVhostRefused",
    "BrokerHostUnknown",
    "BrokerConnectionRefused",
    "BrokerTlsFailed",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'qbroker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
