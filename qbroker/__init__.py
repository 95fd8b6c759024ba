"""qbroker: an asyncio message bus for RabbitMQ implementing the QBroker AMQP structure."""

from qbroker.config import Config
from qbroker.context import RequestContext
from qbroker.errors import (
    BadMessage,
    BrokerUnavailable,
    CallTimeout,
    ConnectionLost,
    ErrorInfo,
    HandlerCrashed,
    HandlerTimeout,
    InvalidParams,
    NoServer,
    NotStarted,
    QBrokerError,
    RequestError,
    RequestFailed,
    TimedOutInQueue,
    UnknownCommand,
    Warn,
    register_error,
)
from qbroker.replies import Reply
from qbroker.unit import Unit

__all__ = [
    "BadMessage", "BrokerUnavailable", "CallTimeout", "Config", "ConnectionLost", "ErrorInfo",
    "HandlerCrashed", "HandlerTimeout", "InvalidParams", "NoServer", "NotStarted", "QBrokerError",
    "Reply", "RequestContext", "RequestError", "RequestFailed", "TimedOutInQueue", "UnknownCommand",
    "Unit", "Warn", "register_error",
]
