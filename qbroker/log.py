"""structlog set-up: qbroker logs with the unit's app and uuid bound, and each message's ids."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

_configured = False


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog once for a qbroker process (console or JSON lines, to stderr)."""
    global _configured
    if _configured:
        return
    _configured = True
    level_name = (level or os.environ.get("QBROKER_LOG_LEVEL", "INFO")).upper()
    use_json = json if json is not None else (
        os.environ.get("QBROKER_LOG_FORMAT", "").lower() == "json"
        or os.environ.get("QBROKER_LOG_JSON", "") not in ("", "0"))
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level_name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: Any) -> FilteringBoundLogger:
    # An application that configured structlog keeps its set-up; otherwise structlog's default would
    # print every debug line to stdout, so qbroker applies its own (INFO, stderr, QBROKER_LOG_LEVEL).
    if not structlog.is_configured():
        configure_logging()
    logger: FilteringBoundLogger = structlog.get_logger("qbroker").bind(**bound)
    return logger
