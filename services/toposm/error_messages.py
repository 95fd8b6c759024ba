"""One message per error id, for every service: the protocol says a given (status, id, part) always carries
the exact same message (docs/wire-format.md, "Error element"). What is particular to the request (a tile, a
metatile, a job id, a count, a reason) goes in the error element's ``detail``, never in ``message``.

qbroker's own error classes keep their message fixed by themselves (``summary``); these are the ids the
services raise as plain ``RequestFailed``/``RequestError``. One table for all services, so an id means one
thing (and reads one way) wherever it comes from.
"""

from __future__ import annotations

from qbroker import RequestError, RequestFailed

MESSAGES: dict[str, str] = {
    # tiles: queuemaster and renderers
    "invalid_tile": "the tile is not valid",
    "invalid_metatile": "the metatile is not valid",
    "busy": "busy; retry later",
    "render_timeout": "the metatile was not rendered before the request's deadline",
    "render_failed": "the metatile failed to render",
    "bulk_cancelled": "the bulk render was withdrawn before it started",
    "forbidden": "this account may not do this",
    "stopping": "shutting down; not taking new work",
    "commit_failed": "the queue state could not be saved",
    "too_large": "the message body exceeds the size limit",
    "unhandled": "the handler raised an unexpected exception",
    # the Spark bridge
    "job_failed": "the job failed",
    "job_cancelled": "the job was cancelled",
    "unknown_job": "no such job",
    "no_user_id": "spark jobs belong to the sending account: set the AMQP user_id",
    "job_not_finished": "the job has not finished",
    "bad_input": "an input is missing or malformed",
    "bad_input_type": "an input is not of a kind this request takes",
    "bad_output_name": "the output name is not allowed",
    "input_not_allowed": "the input is outside this bridge's input roots",
    "no_such_input": "no such input file",
    "over_limit": "a parameter is above this bridge's ceiling",
    "unknown_store": "no such store on this bridge",
    "bad_lines": "lines must be between 0 and 10000",
    "bad_limit": "limit must be between 1 and 1000",
    "spark_starting": "the Spark session is still starting; try again shortly",
    "wait_timeout": "the job is still running after the wait timeout; it keeps running (spark.job status)",
}


def failed(error_id: str, detail: str | None = None) -> RequestFailed:
    """Status ``fail`` with the id's one message (KeyError for an id missing from the table: a bug)."""
    return RequestFailed(error_id, MESSAGES[error_id], detail=detail)


def errored(error_id: str, detail: str | None = None) -> RequestError:
    """Status ``error`` with the id's one message."""
    return RequestError(error_id, MESSAGES[error_id], detail=detail)
