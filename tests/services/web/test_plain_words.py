"""What the pages say about a source that does not answer, and about dead letters: plain words for every
error qbroker can raise and every counter a dead-letter collector keeps."""

from __future__ import annotations

import qbroker.errors
from qbroker import QBrokerError
from services.web.plain_words import dead_letter_meaning, unavailable, why_no_answer


def test_every_qbroker_error_has_plain_words() -> None:
    classes = [
        c
        for c in vars(qbroker.errors).values()
        if isinstance(c, type) and issubclass(c, QBrokerError) and c is not QBrokerError
    ]
    assert len(classes) >= 15
    for cls in classes:
        text = why_no_answer(cls("the particulars"), "the queuemaster", "toposm.queuemaster")
        assert cls.__name__ not in text and f"{cls.status}/" not in text, (cls, text)
    assert unavailable(qbroker.errors.NoServer()) and unavailable(qbroker.errors.TimedOutInQueue())
    assert not unavailable(qbroker.errors.InvalidParams("bad tile"))  # answered: refused, not unavailable


def test_every_dead_letter_counter_is_explained() -> None:
    reasons = (
        "unroutable",
        "expired",
        "rejected",
        "maxlen",
        "delivery_limit",
        "poison",
        "retries_exhausted",
        "unknown",
    )
    keys = [f"{kind}.{reason}" for kind in ("rpc", "alert", "reply", "unknown") for reason in reasons]
    for key in [*keys, "kept", "kept_failed", "other", "forged key from the bus"]:
        assert dead_letter_meaning(key).meaning, key
    assert dead_letter_meaning("alert.unroutable").level == "normal"
    assert dead_letter_meaning("rpc.unroutable").level == "notice"  # a clean run has some: not an error
