"""Progress alerts, ``<service>.progress.<owner>.<job id>``: who may hear them is in the name.

A service that reports a long job's progress (the Spark bridge) names the alert after the job's owner, the
broker account that submitted it (the AMQP ``user_id`` RabbitMQ validated), so that the broker's topic
permissions can let each account hear its own jobs only (``qbroker provision`` grants ``client``
``<service>.progress.<its own word>.#``; docs/security.md) while operators and the status page hear all
(``<service>.progress.#``).

An account name may hold dots, which split routing-key words: ``a.b``'s key would match ``a``'s binding
``x.progress.a.#``. So the owner goes in as one word, each character outside ``[A-Za-z0-9_@-]`` written
``%XX`` (its UTF-8 bytes): one word per account, a different one for each, and never ``*`` or ``#``.
"""

from __future__ import annotations

import re

_WORD_SAFE = re.compile(r"[A-Za-z0-9_@-]")


def progress_prefix(service: str) -> str:
    """``<service>.progress.``: what every progress alert of ``service`` (a routing-key word) starts with."""
    return f"{service}.progress."


def owner_word(account: str) -> str:
    """``account`` as one routing-key word (see above); no account (a job submitted in-process) is ``%``."""
    if not account:
        return "%"
    return "".join(c if _WORD_SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in account)


def progress_key(prefix: str, owner: str | None, job_id: str) -> str:
    """The alert name of ``job_id``'s progress, a job of ``owner`` (``prefix``: ``progress_prefix``)."""
    return f"{prefix}{owner_word(owner or '')}.{job_id}"


def own_progress(prefix: str, account: str) -> str:
    """The binding key of the progress of ``account``'s own jobs."""
    return f"{prefix}{owner_word(account)}.#"
