"""One connection per unit: connect with failover over an ordered URL list, reconnect with backoff.

aio-pika's robust connection reconnects to one URL only and restores state behind our back; we need
failover and a clean "connection lost" moment to fail calls in flight, so this loop owns the cycle:
connect -> ``on_connected`` (declare, consume) -> wait for loss -> ``on_lost`` -> back off -> again.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import aio_pika

from qbroker.config import Config, redact_url
from qbroker.errors import (
    BrokerAuthRefused,
    BrokerConnectionRefused,
    BrokerHostUnknown,
    BrokerTlsFailed,
    BrokerUnavailable,
    BrokerVhostRefused,
)
from qbroker.log import get_logger
from qbroker.transport import Connection, transport_for

OnConnected = Callable[[Connection], Awaitable[None]]
OnLost = Callable[[BaseException | None], Awaitable[None]]


def _with_heartbeat(url: str, heartbeat: int) -> str:
    parts = urlsplit(url)
    if "heartbeat=" in parts.query:
        return url
    query = f"{parts.query}&heartbeat={heartbeat}" if parts.query else f"heartbeat={heartbeat}"
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def read_password(config: Config) -> str | None:
    """The password from ``password_file`` (read at every connect, so a rotated file is picked up) or
    ``password``; None when neither is set (the URL's own password, if any, is used)."""
    if config.password_file is not None:
        try:
            return config.password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            # The path is configuration, not a secret; the file's contents never appear in the message.
            raise ValueError(f"password file {config.password_file}: cannot read ({type(exc).__name__})") from None
    return config.password.get_secret_value() if config.password is not None else None


def broker_url(url: str, config: Config) -> str:
    """``url`` with the configured account and, for ``amqps``, TLS files. Holds the password: never log
    it (``redact_url``) and never put it on a command line."""
    parts = urlsplit(url)
    user = config.username if config.username is not None else unquote(parts.username or "") or None
    password = read_password(config)
    if password is None and parts.password is not None:
        password = unquote(parts.password)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    if parts.port:
        host = f"{host}:{parts.port}"
    if user is not None:
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "")
        host = f"{auth}@{host}"
    query = parts.query
    if parts.scheme.lower() == "amqps":
        # aiormq builds its TLS context from these query parameters (verifying the server by default).
        given = dict(parse_qsl(query))
        tls = {"cafile": config.tls_ca_file, "certfile": config.tls_cert_file, "keyfile": config.tls_key_file}
        extra = {k: str(v) for k, v in tls.items() if v is not None and k not in given}
        if extra:
            query = f"{query}&{urlencode(extra)}" if query else urlencode(extra)
    return urlunsplit((parts.scheme, host, parts.path, query, parts.fragment))


def url_user(url: str, config: Config) -> str:
    """The account a connection to ``url`` logs in as (aiormq's default is guest)."""
    if config.username is not None:
        return config.username
    return unquote(urlsplit(url).username or "") or "guest"


def shown_url(url: str, config: Config) -> str:
    """``url`` as an error message shows it: the account it logs in as, the port even when it is the
    default, the password as ``***`` (when there is one) and no query (TLS file paths, heartbeat)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"amqp": 5672, "amqps": 5671}.get(scheme)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    has_password = parts.password is not None or config.password is not None or config.password_file is not None
    account = quote(url_user(url, config), safe="") + (":***" if has_password else "")
    return urlunsplit((parts.scheme, f"{account}@{host}" + (f":{port}" if port else ""), parts.path or "/", "", ""))


def _vhost(url: str) -> str:
    return unquote(urlsplit(url).path[1:]) or "/"  # amqp://host/ is the default vhost, as in aiormq


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def refusal(exc: BaseException, url: str, config: Config) -> BrokerUnavailable:
    """The typed error for a failed connect to ``url``: one line saying why, naming the URL and account
    (never the password)."""
    where, user = shown_url(url, config), url_user(url, config)
    causes = _causes(exc)
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aio_pika.exceptions.ProbableAuthenticationError | aio_pika.exceptions.AuthenticationError):
        return BrokerAuthRefused(
            f"authentication refused for user {user!r} at {where} (ACCESS_REFUSED: wrong user name or password)"
        )
    # RabbitMQ answers connection.open with connection.close NOT_ALLOWED when the vhost does not exist, is
    # down, or the user has no permissions on it; aiormq reports that close as an unexpected frame and drops
    # its reply text, so the frame's name is what tells it apart.
    if (
        isinstance(exc, aio_pika.exceptions.ConnectionClosed)
        and exc.args[:1] == (530,)
        or (isinstance(exc, aio_pika.exceptions.InvalidFrameError) and "Connection.Close" in text)
    ):
        return BrokerVhostRefused(
            f"vhost {_vhost(url)!r} not allowed for user {user!r} at {where} (NOT_ALLOWED: "
            f"no such vhost, the vhost is down, or the user has no permissions on it)"
        )
    if any(isinstance(c, socket.gaierror) for c in causes):
        host = urlsplit(url).hostname or ""
        return BrokerHostUnknown(f"cannot resolve host {host!r} of {where} ({_os_text(causes)})")
    if any(isinstance(c, ssl.SSLError) for c in causes):
        return BrokerTlsFailed(
            f"TLS handshake failed with {where} ({_os_text(causes)}): "
            f"not a TLS port, or a certificate that does not verify"
        )
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return BrokerConnectionRefused(f"no broker reachable at {where}: connection refused")
    if isinstance(exc, TimeoutError):
        return BrokerUnavailable(f"no broker reachable at {where}: no answer within {config.connect_timeout:g} s")
    return BrokerUnavailable(f"no broker reachable at {where}: {text}")


def _os_text(causes: list[BaseException]) -> str:
    """The innermost OS-level reason (``Name or service not known``, ``[SSL: ...] ...``)."""
    for cause in reversed(causes):
        if isinstance(cause, OSError) and cause.strerror:
            return re.sub(r" \(_ssl\.c:\d+\)$", "", str(cause.strerror))  # OpenSSL's source line says nothing here
        if isinstance(cause, OSError) and cause.args:
            return str(cause.args[-1])
    return str(causes[0]) or type(causes[0]).__name__


def one_refusal(refusals: list[BrokerUnavailable]) -> BrokerUnavailable:
    """The error for a start where every URL failed: their common class (or the base), all their reasons."""
    kinds = {type(r) for r in refusals}
    kind = kinds.pop() if len(kinds) == 1 else BrokerUnavailable
    return kind("; ".join(r.message for r in refusals))


class ConnectionSupervisor:
    def __init__(self, config: Config, on_connected: OnConnected, on_lost: OnLost, **log_ctx: str) -> None:
        self._config = config
        self._on_connected = on_connected
        self._on_lost = on_lost
        self._urls = list(config.urls)
        for url in self._urls:
            transport_for(url)  # an unknown scheme is a configuration error: say so before connecting
        self._users = [url_user(url, config) for url in self._urls]  # read for every message published
        self._log = get_logger(**log_ctx)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.connection: Connection | None = None
        self.ready = asyncio.Event()
        self.url_index = 0

    async def start(self) -> None:
        """Connect now (trying each URL once); raise BrokerUnavailable if none answers."""
        # Each URL once, no retry: a refused login or vhost does not fix itself, and a caller that wants to
        # wait for a broker that is starting retries start() (the error says which case it is). Quiet: the error
        # raised names every URL's reason; a warning for each would say it twice.
        refusals: list[BrokerUnavailable] = []
        connection = await self._connect_any(refusals)
        if connection is None:
            raise one_refusal(refusals)
        await self._established(connection)
        self._task = asyncio.create_task(self._supervise(), name="qbroker-connection")

    async def _connect_any(self, refusals: list[BrokerUnavailable] | None = None) -> Connection | None:
        """A connection to the first URL that answers, or None; why each failed is added to ``refusals`` (then
        logged at debug level only: the caller reports them)."""
        for _ in range(len(self._urls)):
            url = self._urls[self.url_index]
            try:
                connect = transport_for(url)
                return await connect(
                    _with_heartbeat(broker_url(url, self._config), self._config.heartbeat),
                    timeout=self._config.connect_timeout,
                )
            except (TimeoutError, OSError, aio_pika.exceptions.AMQPError) as exc:
                refused = refusal(exc, url, self._config)
                if refusals is not None:
                    refusals.append(refused)
                # A refused login or vhost is an error, not a passing state; a reconnect still retries it, as
                # RabbitMQ refuses a vhost while it restarts and a rotated password file is read at each connect.
                log = (
                    self._log.debug
                    if refusals is not None
                    else self._log.warning
                    if refused.retryable
                    else self._log.error
                )
                log("broker unreachable", url=redact_url(url), cause=refused.id, error=refused.message)
                # Move the failing broker to the back of the line (RQ's SERVER_FULL rule).
                self.url_index = (self.url_index + 1) % len(self._urls)
        return None

    async def _established(self, connection: Connection) -> None:
        lost: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

        def _closed(_: object, exc: BaseException | None = None) -> None:
            if not lost.done():
                lost.set_result(exc)

        connection.close_callbacks.add(_closed)
        self._lost = lost
        self.connection = connection
        try:
            await self._on_connected(connection)
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        self.ready.set()
        self._log.info("connected", url=redact_url(self._urls[self.url_index]))

    @property
    def user(self) -> str:
        """The account of the current (or next) connection: qbroker sets it as every message's user-id."""
        return self._users[self.url_index]

    def lose(self, reason: BaseException | None = None) -> None:
        """Declare the connection broken (e.g. a channel died) so the supervisor rebuilds everything."""
        if self.connection is not None and not self.connection.is_closed:
            asyncio.ensure_future(self.connection.close(reason or ConnectionError("connection abandoned")))

    async def _supervise(self) -> None:
        while not self._stopping:
            exc = await self._lost
            self.ready.clear()
            self.connection = None
            if self._stopping:
                return
            self._log.warning("connection lost", error=str(exc) if exc else None)
            await self._on_lost(exc)
            delay = 0.1
            while not self._stopping:
                connection = await self._connect_any()
                if connection is not None:
                    try:
                        await self._established(connection)
                        break
                    except Exception as err:  # declare failed mid-way: start over
                        self._log.warning("setup after reconnect failed", error=str(err))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._config.reconnect_backoff_max)

    async def wait_ready(self, timeout: float | None) -> bool:
        if self.ready.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):  # not wait_for: 3.11's can swallow a cancel
                await self.ready.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.connection is not None and not self.connection.is_closed:
            with contextlib.suppress(Exception):
                await self.connection.close()
        self.connection = None
        self.ready.clear()
