"""toposm-web's access log: ``--access-log PATH`` or ``-`` (standard output), or ``TOPOSM_ACCESS_LOG``; off by
default. One line per request in the Combined Log Format, the one Apache's and nginx's ``combined``
write and log tools read (GoAccess, AWStats, fail2ban, ...)::

    127.0.0.1 - - [28/Nov/2026:09:15:02 +0100] "GET /tiles/12/1001/2047.png HTTP/1.1" 200 5312 "-" "curl/8.5"

As nginx does, a quote, a backslash, a control character and any byte outside printable ASCII in the
request line, the referrer or the user agent is written ``\\xHH``: a client cannot end a field early or
forge a line. Nothing in a request to toposm-web is a credential (no authentication, cookies are not
logged, no query string carries a secret), so the request line is logged as sent.

A file is reopened when it is moved or removed (``logging.handlers.WatchedFileHandler``), so logrotate
needs no signal; standard output is written without ever blocking the event loop (``qbroker.log``'s
``DroppingLogger``: a stalled reader costs lines, counted, not the service). Behind ``--front nginx`` the
front logs every request, its hits included, in the same format (services/web/front.py), and toposm-web
logs none.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from datetime import datetime, timedelta

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from qbroker.log import DroppingLogger

ACCESS_LOG_ENV = "TOPOSM_ACCESS_LOG"
STDOUT = "-"
LOGGER_NAME = "toposm.web.access"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# nginx's escaping of logged variables: what would end a field or a line, or is not printable ASCII.
_KEPT = frozenset(range(0x20, 0x7F)) - {ord('"'), ord("\\")}


def escape(text: str) -> str:
    try:  # the bytes as received (aiohttp decodes what is not UTF-8 with surrogateescape)
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    return "".join(chr(b) if b in _KEPT else f"\\x{b:02X}" for b in raw)


def clf_time(when: datetime) -> str:
    """``[10/Oct/2000:13:55:36 -0700]``, month names in English whatever the locale."""
    return f"[{when.day:02d}/{_MONTHS[when.month - 1]}/{when:%Y:%H:%M:%S %z}]"


def body_bytes(request: BaseRequest, response: StreamResponse) -> int:
    """The body's size, as the format wants it (aiohttp's ``body_length`` counts the headers too)."""
    if request.method == "HEAD" or response.status in (204, 304):
        return 0
    if response.content_length is not None:
        return response.content_length
    # A stream (/events): what was written, less the status line and the headers.
    head = len(f"HTTP/{request.version.major}.{request.version.minor} {response.status} {response.reason}\r\n\r\n")
    head += sum(len(name) + len(value) + 4 for name, value in response.headers.items())
    return max(0, response.body_length - head)


def combined_line(request: BaseRequest, response: StreamResponse, elapsed: float) -> str:
    version = request.version
    request_line = f"{request.method} {request.raw_path} HTTP/{version.major}.{version.minor}"
    received = datetime.now().astimezone() - timedelta(seconds=elapsed)
    referer = request.headers.get("Referer")
    agent = request.headers.get("User-Agent")
    quoted = [f'"{escape(text) if text else "-"}"' for text in (request_line, referer, agent)]
    return (
        f"{request.remote or '-'} - - {clf_time(received)} {quoted[0]} {response.status} "
        f"{body_bytes(request, response)} {quoted[1]} {quoted[2]}"
    )


class CombinedAccessLogger(AbstractAccessLogger):
    """aiohttp's access logger, writing the Combined Log Format (aiohttp's own escapes nothing)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.info(combined_line(request, response, time))


class _StdoutHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.out = DroppingLogger(sys.stdout)

    def emit(self, record: logging.LogRecord) -> None:
        self.out.msg(self.format(record))


def open_access_log(target: str) -> logging.Logger:
    """The logger the access lines go to: ``target`` a file (appended to) or ``-``. Raises OSError when the
    file cannot be opened."""
    handler: logging.Handler = (
        _StdoutHandler() if target == STDOUT else logging.handlers.WatchedFileHandler(target, encoding="utf-8")
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # these lines are the access log's alone, not the service's log
    return logger
