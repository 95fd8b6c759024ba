"""A deployment's accounts and what the broker lets each do: the model behind ``qbroker provision``.

One description file (TOML) names the vhost, the exchange prefix and the accounts, each with a role. The roles
are data (``qbroker.cli.roles``: the library's own, the installed services', files given on the command line).
A role becomes a set of RabbitMQ permissions: configure/write/read regexes over exchange and queue names, and
**topic permissions** (write/read regexes over routing keys) on the topic exchanges ``rpc`` and ``alert`` and
any other a role names (TopOSM's ``osm``). Topic write is checked on every publish; topic read when a
queue is bound to the exchange, so an account cannot bind its own queue to overhear (or serve) a name it may
not serve.

What the broker cannot see (a command word inside a body, the ``shutdown`` word inside a control alert) is
checked by the receiver against the message's broker-validated ``user_id``; the env lines printed for each
service (a role's ``listed_in``, e.g. ``TOPOSM_RENDERER_USERS``) configure those checks. docs/security.md
explains every rule below.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qbroker.cli.roles import ACCOUNT, ROLE_NAME, Grants, RoleBook
from qbroker.progress import owner_word

NOTHING = "^$"  # RabbitMQ has no "deny" pattern: a regex only the empty name matches grants nothing
UUID = "[0-9a-f]{32}"
ACCOUNT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"


class Account(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=ACCOUNT_NAME)
    role: str = Field(pattern=ROLE_NAME)


class Deployment(BaseModel):
    """The description file (TOML)::

    vhost = "toposm"
    exchange_prefix = ""          # the deployment's QBROKER_EXCHANGE_PREFIX
    secrets_dir = "secrets"       # generated passwords, one file per account (relative to this file)

    [[account]]
    name = "toposm-queuemaster"
    role = "queuemaster"          # qbroker provision --list-roles: the roles known here
    """

    model_config = ConfigDict(extra="forbid")

    vhost: str = Field(min_length=1)
    exchange_prefix: str = ""
    secrets_dir: Path = Path("secrets")
    account: list[Account] = Field(min_length=1)

    def users(self, roles: list[str]) -> list[str]:
        return [a.name for a in self.account if a.role in roles]


class DescriptionError(ValueError):
    """The description file is unreadable or invalid."""


def load_deployment(path: Path, roles: RoleBook | None = None) -> Deployment:
    """The description at ``path``; with ``roles``, every account's role must be one of them (removing the
    accounts needs no roles)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        deployment = Deployment.model_validate(raw)
    except OSError as exc:
        raise DescriptionError(f"{path}: cannot read ({type(exc).__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DescriptionError(f"{path}: not TOML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise DescriptionError(f"{path}: {problems}") from None
    names = [a.name for a in deployment.account]
    if len(names) != len(set(names)):
        raise DescriptionError(f"{path}: an account name appears twice")
    unknown = sorted({a.role for a in deployment.account if roles is not None and a.role not in roles})
    if unknown and roles is not None:
        raise DescriptionError(
            f"{path}: no such role {', '.join(unknown)} (known: {', '.join(sorted(roles.roles))}; "
            "a service's roles come with its installation, entry points qbroker.roles, "
            "or from --roles FILE)"
        )
    if not deployment.secrets_dir.is_absolute():
        deployment.secrets_dir = path.parent / deployment.secrets_dir
    return deployment


@dataclass(frozen=True)
class Permissions:
    configure: str
    write: str
    read: str
    topics: dict[str, tuple[str, str]]  # exchange -> (write, read) routing-key regexes


def _any(*alternatives: str) -> str:
    return "^(" + "|".join(alternatives) + ")$"


def permissions_for(grants: Grants, roles: RoleBook, prefix: str, account: str = "") -> Permissions:
    """The broker permissions of a role's ``grants`` for ``account`` (``prefix``: the deployment's exchange
    prefix; ``{account}`` in a role's pattern stands for the account's progress word, ``qbroker.progress``)."""
    p = re.escape(prefix)
    exchanges = f"{p}(rpc|reply|alert|dead)"
    kept_in, kept = rf"{p}dead\.kept\.in", rf"{p}dead\.kept"
    # The shared exchanges and queues (qbroker.topology; `dead` names the exchange and its queue) and the
    # service-owned topic exchanges roles name (`osm`): `qbroker provision` declares them, every unit finds
    # them with a passive declare, which the broker checks no permission for. Configure on one would let an
    # account delete it (exchange.delete and queue.delete need nothing else), or re-declare it otherwise:
    # no role gets it, whatever its resources say.
    shared = "|".join([exchanges, kept_in, kept, *(re.escape(name) for name in roles.exchanges())])
    not_shared = f"(?!({shared})$)"
    if grants.everything:
        # A person with the CLI (call, alert, list, debug snooping): any resource but the shared ones' configure,
        # limited by topic rules.
        return Permissions(f"^{not_shared}.*$", ".*", ".*", _everything_topics(roles))
    # Its own exclusive reply_/alert_ queues (exclusive: no other connection can consume them, so a pattern
    # over every uuid does not let one unit read another's replies), the queues of the names it serves and
    # their retries (qbroker.retry.<name>.<ms>, declared and bound by the server itself), its resources.
    served = [rf"{p}rpc_({name})" for name in grants.serve]
    retries = [rf"{p}qbroker\.retry\.({name})\.[0-9]+" for name in grants.serve]
    # Its own exclusive rpc_qbroker.uuid.<uuid> too: its address for the original QBroker's discovery
    # (qbroker.presence; docs/interop.md), as exclusive as the others.
    own = [f"{p}(reply|alert)_{UUID}", rf"{p}rpc_qbroker\.uuid\.{UUID}", *served, *grants.resources, *retries]
    # Publishing on the four exchanges needs write; binding the shared queues write on the queue and read on
    # the exchange (`dead` to `dead`, `dead.kept` to `dead.kept.in`); collecting dead letters read on `dead`.
    # Only operators read `dead.kept`: the copies hold other accounts' requests. A topic exchange a role has
    # grants on: write to publish there, read to bind to it.
    topic_write = [re.escape(name) for name, grant in grants.topics.items() if grant.write]
    topic_read = [re.escape(name) for name, grant in grants.topics.items() if grant.read]
    uses = [*own, exchanges, kept_in]
    # Publishing on the default exchange reaches any queue by name, past every topic permission: only a role
    # that must (TopOSM's `osm` wire answers on it) gets it.
    default = ["amq\\.default"] if grants.default_exchange else []
    return Permissions(
        f"^{not_shared}({'|'.join(own)})$",
        _any(*uses, kept, *topic_write, *default),
        _any(*uses, *topic_read),
        _topics(grants, account),
    )


def _broadcast(names: list[str]) -> list[str]:
    return [r"qbroker\.broadcast\." + name for name in names]


def _rule(names: list[str]) -> str:
    return _any(*names) if names else NOTHING


def _everything_topics(roles: RoleBook) -> dict[str, tuple[str, str]]:
    """Every routing key but the names some role reserves for itself (and broadcasts to them)."""
    reserved = roles.reserved()
    if reserved:
        names = "(" + "|".join(reserved) + ")"
        rpc_write, alert_write = rf"^(?!{names}$).*$", rf"^(?!qbroker\.broadcast\.{names}$).*$"
    else:
        rpc_write = alert_write = ".*"
    return {
        "rpc": (rpc_write, ".*"),
        "alert": (alert_write, ".*"),
        **{exchange: (".*", ".*") for exchange in roles.exchanges()},
    }


def _topics(grants: Grants, account: str) -> dict[str, tuple[str, str]]:
    """(write, read) routing-key patterns on each topic exchange (the prefix does not change names), with
    ``{account}`` filled in (as it is when ``account`` is empty: ``--list-roles``)."""
    lifecycle = r"qbroker\.(start|stop|ping)"  # every unit announces itself and answers qbroker.ping
    # A server re-publishes a redelivered request to its own name (with its failure count, qbroker.rpc),
    # so it may publish to the names it serves on shared queues; a refused re-publish would close its
    # channel and redeliver the request again, forever. Not to names on exclusive queues (never redelivered
    # elsewhere): a role serving those says which it re-publishes to (``republish``).
    republish = grants.serve if grants.republish is None else grants.republish
    # A failed request parked for a retry goes out on `rpc` as qbroker.retry.<ms>.<name> (qbroker.rpc): the
    # server may publish (and bind its delay queue) with the names it serves, nothing else.
    retry = [r"qbroker\.retry\.[0-9]+\.(" + name + ")" for name in grants.serve]
    # Every unit's address for the original QBroker's discovery: its uuid's and its app's keys (anyone may bind
    # them, as anyone may bind ``reply`` with a uuid; an app's address answers pings only: qbroker.presence).
    addresses = [r"qbroker\.uuid\." + UUID, r"qbroker\.app\.[^*#]+"]
    # Every unit hears the others announce themselves (lifecycle on alert): its ping guard learns whose uuid is
    # whose.
    topics = {
        "rpc": (_rule([*grants.call, *republish, *retry]), _rule([*grants.serve, *retry, *addresses])),
        "alert": (
            _rule([lifecycle, *grants.alert, *_broadcast(grants.call)]),
            _rule([lifecycle, *grants.hear, *_broadcast(grants.serve)]),
        ),
        **{exchange: (_rule(grant.write), _rule(grant.read)) for exchange, grant in grants.topics.items()},
    }
    if not account:
        return topics
    word = re.escape(owner_word(account))
    return {
        exchange: (write.replace(ACCOUNT, word), read.replace(ACCOUNT, word))
        for exchange, (write, read) in topics.items()
    }


def service_env(deployment: Deployment, roles: RoleBook) -> dict[str, str]:
    """What the receivers check against ``user_id`` (the part the broker cannot see): each variable a role
    is ``listed_in``, with the accounts of those roles."""
    return {variable: ",".join(deployment.users(listed)) for variable, listed in roles.listed_in().items()}
