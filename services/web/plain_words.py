"""What toposm-web's pages say when something is down, in plain words: the one place that turns qbroker's
error classes (a poll or a render that got no answer) and the dead-letter collectors' keys into phrases
an operator or a map user reads. The technical text (``error/queue_timeout: ...``) stays available as the
detail (a tooltip, the JSON), never as the headline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from qbroker import (
    BrokerUnavailable,
    CallTimeout,
    ConnectionLost,
    DeadlinePassed,
    HandlerCrashed,
    HandlerTimeout,
    NoServer,
    NotStarted,
    PoisonRequest,
    QBrokerError,
    RequestError,
    RequestFailed,
    TimedOutInQueue,
)

# Most specific first: NoServer is a RequestFailed, TimedOutInQueue a RequestError.
_WHY: tuple[tuple[type[QBrokerError], str], ...] = (
    (NoServer, "{who} is not running (nobody serves {name} on the bus)"),
    (TimedOutInQueue, "{who} is not taking requests: they wait in its queue until they expire (stopped, or stuck)"),
    (DeadlinePassed, "{who} took the request only after its deadline (overloaded)"),
    (CallTimeout, "{who} did not answer in time (stopped, overloaded or stuck)"),
    (ConnectionLost, "toposm-web lost its connection to the broker (reconnecting)"),
    (BrokerUnavailable, "toposm-web cannot reach the broker"),
    (NotStarted, "toposm-web is not connected to the bus yet"),
    (PoisonRequest, "the request crashed or hung {who} several times; it was set aside (qbroker dead list)"),
    (HandlerCrashed, "{who} failed on the request (its log has the traceback)"),
    (HandlerTimeout, "{who} took longer than it allows itself to answer"),
    (RequestFailed, "{who} answered with an error: {message}"),
    (RequestError, "{who} answered with an error: {message}"),
)


def why_no_answer(exc: QBrokerError, who: str, name: str) -> str:
    """Why ``who`` (``the queuemaster``, serving ``name`` on the bus) gave no usable answer, in plain words."""
    for cls, text in _WHY:
        if isinstance(exc, cls):
            return text.format(who=who, name=name, message=exc.message or exc.id)
    return f"{who} could not be asked ({exc.id})"


def unavailable(exc: QBrokerError) -> bool:
    """No server answered the request (nobody serves the name, it expired waiting in the queue, no reply in
    time, the broker is out of reach): what is asked for is unavailable, not refused."""
    return exc.undelivered or isinstance(exc, CallTimeout | ConnectionLost | BrokerUnavailable | NotStarted)


Level = Literal["normal", "notice", "attention"]


@dataclass(frozen=True)
class DeadLetterMeaning:
    meaning: str
    level: Level  # normal: expected on a healthy bus; notice: worth a look if it grows; attention: a loss


# The dead-letter collectors count ``<kind>.<reason>`` (qbroker/dead_letter.py: kind of the exchange the
# message was published to, reason from the broker), ``kept`` and ``kept_failed`` (copies for dead.kept).
DEAD_LETTER_MEANINGS: dict[str, DeadLetterMeaning] = {
    "alert.unroutable": DeadLetterMeaning(
        "alerts nobody listens to (e.g. qbroker.start where no one follows starts): normal", "normal"
    ),
    "rpc.unroutable": DeadLetterMeaning(
        "requests to a name nobody serves, answered no_server at once: normal while services start, and "
        "for toposm-web's spark.job poll where no Spark bridge runs",
        "notice",
    ),
    "rpc.expired": DeadLetterMeaning(
        "requests that waited in their server's queue until they expired: the server was stopped or stuck", "attention"
    ),
    "rpc.rejected": DeadLetterMeaning("requests a server rejected (answered fail/rejected)", "attention"),
    "rpc.poison": DeadLetterMeaning(
        "requests that crashed or hung their servers several times: set aside, see qbroker dead list", "attention"
    ),
    "rpc.retries_exhausted": DeadLetterMeaning(
        "requests that failed on every retry: set aside, see qbroker dead list", "attention"
    ),
    "rpc.maxlen": DeadLetterMeaning("requests dropped because their queue was full", "attention"),
    "rpc.delivery_limit": DeadLetterMeaning("requests redelivered more often than their queue allows", "attention"),
    "reply.unroutable": DeadLetterMeaning(
        "replies whose caller was gone (it stopped or gave up before the answer)", "notice"
    ),
    "kept": DeadLetterMeaning("dead requests copied to dead.kept, for qbroker dead list and replay", "notice"),
    "kept_failed": DeadLetterMeaning("dead requests that could not be copied to dead.kept", "attention"),
    "other": DeadLetterMeaning("the rest, summed (more kinds than the page lists)", "notice"),
}
_BY_KIND = {
    "alert": DeadLetterMeaning("alerts that died in a listener's queue (expired or dropped)", "notice"),
    "rpc": DeadLetterMeaning("requests that died in their queue", "attention"),
}
_UNKNOWN = DeadLetterMeaning("messages of unknown origin (published straight to the dead exchange)", "notice")


def dead_letter_meaning(key: str) -> DeadLetterMeaning:
    """What a dead-letter counter's key means, for the status page's legend."""
    return DEAD_LETTER_MEANINGS.get(key) or _BY_KIND.get(key.partition(".")[0], _UNKNOWN)
