"""Whether a source toposm-web polls (the queuemaster, the Spark bridge) answers, and since when.

The pages say what is down and since when ("queuemaster not answering since 12:03:04 (45 s)"), grey the
figures it gave last, and say when it is back: they need when it was last heard, why it does not answer
now (plain words, services/web/plain_words.py; the technical error as the detail) and when an outage
ended. Times are Unix times (the pages show them on the viewer's clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .bounds import clean

RECOVERY_NOTICE = 60.0  # seconds the pages say "answering again" after an outage


@dataclass
class SourceHealth:
    started: float = field(default_factory=time.time)  # when toposm-web started asking
    polled: bool = False  # a poll has ended (before that nothing is known)
    heard_at: float | None = None  # its last answer
    problem: str | None = None  # why it does not answer now, in plain words (None: it answers)
    detail: str | None = None  # the technical error behind ``problem``
    back_at: float | None = None  # when it answered again after its last outage
    was_down_for: float | None = None  # how long that outage lasted, from its last answer before
    first_answer: bool = False  # that outage was the time before its first answer

    @property
    def online(self) -> bool:
        return self.polled and self.problem is None

    def answered(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self.problem is not None:
            self.back_at, self.first_answer = now, self.heard_at is None
            self.was_down_for = now - (self.heard_at if self.heard_at is not None else self.started)
        self.polled, self.heard_at, self.problem, self.detail = True, now, None, None

    def failed(self, problem: str, detail: str | None = None) -> None:
        self.polled, self.problem, self.detail = True, problem, detail

    def view(self, now: float | None = None) -> dict[str, Any]:
        """For the pages: ``online``; while not, ``error`` (plain words), ``detail`` and ``down_since`` (its
        last answer, or when toposm-web started asking if it never answered: ``never_heard``); ``back_at``
        and ``was_down_for`` of the last outage (``first_answer``: it had never answered before), with
        ``recovered`` while that is recent."""
        now = time.time() if now is None else now
        down = self.polled and self.problem is not None
        since = self.heard_at if self.heard_at is not None else self.started
        return {
            "online": self.online,
            "error": clean(self.problem, 300) if self.problem is not None else None,
            "detail": clean(self.detail, 300) if self.detail is not None else None,
            "heard_at": _rounded(self.heard_at),
            "down_since": _rounded(since) if down else None,
            "never_heard": self.heard_at is None,
            "back_at": _rounded(self.back_at),
            "was_down_for": _rounded(self.was_down_for),
            "first_answer": self.first_answer,
            "recovered": self.online and self.back_at is not None and now - self.back_at < RECOVERY_NOTICE,
        }


def _rounded(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
