"""Who may give the queuemaster which command: the check the broker cannot make.

The broker's topic permissions decide who may publish to ``toposm.queuemaster`` at all (renderers and
clients both must), but the command word is inside the body. So the queuemaster checks the message's
AMQP ``user_id``, which RabbitMQ validates against the publishing connection's account (a client cannot
claim to be a renderer), against this policy (toposm-queuemaster's --renderer-users, --expire-users, --bulk-users).
``qbroker provision --env`` prints the settings.

A policy without renderer accounts (``renderers is None``) checks nothing: a development bus where every
program shares one account. docs/security.md says why production must not run that way.
"""

from __future__ import annotations

from dataclasses import dataclass

from qbroker import RequestFailed
from services.toposm.contract import Command
from services.toposm.error_messages import MESSAGES

RENDERER_COMMANDS = frozenset({Command.REGISTER, Command.RENDERED, Command.UNREGISTER})
BULK_COMMANDS = frozenset({Command.BULK, Command.CANCEL})


class Forbidden(RequestFailed):
    """The sender's account may not do this (status ``fail``, id ``forbidden``, the id's one message; what
    was refused and whose goes in ``detail``)."""

    def __init__(self, detail: str) -> None:
        super().__init__("forbidden", MESSAGES["forbidden"], detail=detail)


@dataclass(frozen=True)
class AccessPolicy:
    renderers: frozenset[str] | None = None  # accounts whose threads may register/report/unregister
    expirers: frozenset[str] | None = None  # accounts that may send `expire` (None: anyone who may call)
    bulk: frozenset[str] | None = None  # accounts that may pre-render (`bulk`, `cancel`; None: anyone)

    @property
    def strict(self) -> bool:
        return self.renderers is not None

    def check(self, command: str, user: str | None) -> None:
        """Raise Forbidden unless ``user`` may send ``command`` at all (threads are checked later)."""
        if command in RENDERER_COMMANDS and self.renderers is not None and user not in self.renderers:
            raise Forbidden(f"{command!r} is for renderer accounts; {describe_account(user)} is not one")
        if command == "expire" and self.expirers is not None and user not in self.expirers:
            raise Forbidden(f"{describe_account(user)} may not expire tiles")
        if command in BULK_COMMANDS and self.bulk is not None and user not in self.bulk:
            raise Forbidden(f"{describe_account(user)} may not pre-render tiles")


def describe_account(user: str | None) -> str:
    return f"account {user!r}" if user else "a message without a user_id"
