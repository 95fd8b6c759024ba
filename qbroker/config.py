"""Settings for a unit, read from the environment (``QBROKER_*``) or passed in code."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ExchangeRole = Literal["rpc", "reply", "alert", "dead"]


class Config(BaseSettings):
    """Everything a unit needs to find its broker and exchanges.

    ``url`` may hold several broker URLs separated by commas; they are tried in order and the unit
    fails over to the next one when a broker is lost.
    """

    model_config = SettingsConfigDict(env_prefix="QBROKER_", extra="ignore")

    url: str = "amqp://guest:guest@127.0.0.1:5672/"
    # The account apart from the URL, so that a password need not sit in a URL, on a command line or in
    # a process title: QBROKER_USERNAME, QBROKER_PASSWORD or (better) QBROKER_PASSWORD_FILE, read at each
    # connect. They override the URL's user and password, for every URL of the list.
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    # TLS for amqps:// URLs: the CA that signed the broker's certificate, and this client's certificate
    # and key when the broker asks for one (QBROKER_TLS_CA_FILE, QBROKER_TLS_CERT_FILE, QBROKER_TLS_KEY_FILE).
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    app: str = "qbroker.unit"
    exchange_prefix: str = ""
    rpc_exchange: str = "rpc"
    reply_exchange: str = "reply"
    alert_exchange: str = "alert"
    dead_exchange: str = "dead"
    dead_queue: str = "dead"
    call_timeout: float = Field(10.0, gt=0)
    heartbeat: int = Field(30, ge=0)
    connect_timeout: float = Field(5.0, gt=0)
    reconnect_backoff_max: float = Field(5.0, gt=0)
    drain_timeout: float = Field(10.0, ge=0)
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    # The body types read (anything else is refused ``bad_body``); the last two are the original QBroker's JSON
    # and bytes (docs/interop.md).
    accept: list[str] = [
        "application/json",
        "text/plain",
        "application/octet-stream",
        "application/json+obj",
        "application/binary",
    ]
    # Every unit helps answer dead requests, so a call to a missing service fails in milliseconds
    # even without a standalone collector. Turn off for units that must not touch the shared queue.
    dead_letters: bool = True
    # Dead messages nobody collects should not pile up forever in the shared `dead` queue.
    dead_queue_ttl_ms: int = Field(24 * 3600 * 1000, gt=0)
    # A copy of what was dead-lettered is kept (docs/semantics.md, "Dead letters are kept"). The collector that
    # takes a dead request copies it to the `dead.kept.in` exchange and `dead.kept` queue, which no unit consumes:
    # operators list, show and replay it (`qbroker dead`); bounded by count and bytes (oldest dropped first) and
    # age. Every declaration must carry the same bounds. Bytes too: every account may publish there, and 10,000
    # copies of 16 MiB requests would be 160 GB on the broker's disk (its disk alarm blocks every publisher).
    dead_kept_queue: str = "dead.kept"
    dead_kept_max: int = Field(10_000, gt=0)
    dead_kept_max_bytes: int = Field(256 * 1024 * 1024, gt=0)
    dead_kept_ttl_ms: int = Field(7 * 24 * 3600 * 1000, gt=0)
    # Grace after the last server of a name is gone: then RabbitMQ deletes ``rpc_<name>`` (x-expires),
    # its binding goes, and requests fall through the alternate exchange to `dead`, answered
    # ``no_server`` at once. Requests queued during a shorter restart are still served. None: never.
    rpc_queue_expiry: float | None = Field(30.0, gt=0)
    # Casts (and scheduled casts) expire after this long unserved instead of running as a stale burst.
    cast_ttl: float = Field(300.0, gt=0)
    # A server drops a request whose ``deadline`` header passed more than this long ago (clock skew).
    deadline_slack: float = Field(1.0, ge=0)
    # Plain ``def`` handlers run in a thread pool of this size (one per unit), never on the event loop.
    sync_handler_threads: int = Field(8, ge=1)
    # A request whose deliveries ended this many times without an answer (its server crashed, hung until
    # the broker dropped it, or was killed) is answered ``poison_request`` and sent to `dead`.
    max_redeliveries: int = Field(3, ge=1)
    # QBROKER_OTEL=1: every unit traces with OpenTelemetry (qbroker.tracing; pip install 'qbroker-amqp[otel]').
    otel: bool = False
    # Pings answered per sending account (user-id): a burst of this many, refilled at this rate a second
    # (docs/security.md, "Ping reflection"). `qbroker list`, qbroker-debug's roll calls and toposm-web's
    # discovery ping every few seconds at most.
    ping_burst: int = Field(20, ge=1)
    ping_rate: float = Field(2.0, gt=0)
    # Answer the original QBroker's discovery on rpc (qbroker.uuid.<uuid>, qbroker.app.<app>): one more exclusive
    # queue a unit (docs/interop.md).
    original_discovery: bool = True
    # A starting unit waits up to this long for listening debuggers (qbroker-debug) to follow its replies,
    # so a short-lived client's reply is never missed; with no debugger it does not wait at all.
    debugger_wait: float = Field(0.5, ge=0)
    # The unit's reply queue outlives a broker restart (durable, not exclusive, deleted x-expires after the
    # unit is gone), so the reply to a guaranteed request sent while the unit reconnects still reaches it.
    # Off by default: an exclusive queue can be consumed by its own connection only.
    durable_reply_queue: bool = False
    # A handler running longer than this is stuck (alive, no progress): its endpoint's unacked requests go
    # to other servers and it takes no new work until its stuck handlers end. None: never (the default;
    # set it above the slowest legitimate handler, or give endpoints a ``timeout``).
    stuck_after: float | None = Field(None, gt=0)
    reply_queue_expiry: float = Field(60.0, gt=0)
    # A call holds a reply it cannot read this long in case a readable one to the same request follows: two
    # dead-letter collectors answer each dead request where another program's (the original QBroker's) shares
    # the bus with qbroker's, and the other one's answer may be one qbroker cannot read (qbroker.replies).
    unreadable_reply_grace: float = Field(0.5, ge=0)
    # A server remembers the outcomes of this many guaranteed requests it answered (each until its deadline),
    # so a second copy of one (published again by a caller that lost its connection before the broker's
    # confirm, or redelivered) gets the same answer without running it again. 0: only copies that arrive
    # while the first still runs are spared.
    guaranteed_answers_kept: int = Field(1000, ge=0)
    # QBROKER_QUEUE_TYPE=quorum: the durable queues whose messages must outlive the loss of a node (shared
    # rpc_<name> request queues and their retry queues, dead, dead.kept, the schedules, a durable reply
    # queue) are RabbitMQ quorum queues, replicated over the cluster's nodes (docs/scaling.md). Exclusive
    # queues stay classic (they die with their connection anyway), and so does an endpoint with
    # ``max_priority`` (quorum queues have no priorities before RabbitMQ 4.0). A queue's type is fixed when it
    # is created, so every unit of a vhost must agree, as on the other queue arguments.
    queue_type: Literal["classic", "quorum"] = "classic"

    def durable_queue_type(self) -> dict[str, Any]:
        """The arguments that make a durable shared queue of ``queue_type`` (none for classic, the default)."""
        return {"x-queue-type": "quorum"} if self.queue_type == "quorum" else {}

    @property
    def debuggers_queue_name(self) -> str:
        """Each running qbroker-debug consumes this queue: its consumer count says how many listen."""
        return self.exchange_prefix + "qbroker.debuggers"

    @field_validator("url")
    @classmethod
    def _urls_not_empty(cls, value: str) -> str:
        if not [u for u in value.split(",") if u.strip()]:
            raise ValueError("at least one broker URL is required")
        return value

    @property
    def urls(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]

    def exchange_name(self, role: ExchangeRole) -> str:
        base = {
            "rpc": self.rpc_exchange,
            "reply": self.reply_exchange,
            "alert": self.alert_exchange,
            "dead": self.dead_exchange,
        }[role]
        return self.exchange_prefix + base

    def queue_name(self, kind: Literal["rpc", "reply", "alert"], suffix: str) -> str:
        return f"{self.exchange_prefix}{kind}_{suffix}"

    @property
    def dead_queue_name(self) -> str:
        return self.exchange_prefix + self.dead_queue

    @property
    def dead_kept_queue_name(self) -> str:
        return self.exchange_prefix + self.dead_kept_queue

    @property
    def dead_kept_exchange_name(self) -> str:
        # Not the queue's name: broker permissions match both by name, and every account must read
        # (bind) the exchange while only operators read the queue.
        return self.dead_kept_queue_name + ".in"


def redact_url(url: str) -> str:
    """The URL without its password, safe for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None and "@" not in parts.netloc:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    netloc = f"{user}:***@{host}" if user else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
