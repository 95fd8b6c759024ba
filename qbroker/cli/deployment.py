"""A deployment's accounts and what the broker lets each do: the model behind ``qbroker provision``.

One description file (TOML) names the vhost, the exchange prefix and the accounts, each with a role.
A role is a set of RabbitMQ permissions: configure/write/read regexes over exchange and queue names, and
**topic permissions** (write/read regexes over routing keys) on the topic exchanges ``rpc``, ``alert`` and
the seed's ``osm``. Topic write is checked on every publish; topic read when a queue is bound to the
exchange, so an account cannot bind its own queue to overhear (or serve) a name it may not serve.

What the broker cannot see (the command word inside a ``toposm.queuemaster`` body, the ``shutdown`` word
inside a control alert) is checked by the receiver against the message's broker-validated ``user_id``;
the env lines printed for each service (``TOPOSM_RENDERER_USERS`` ...) configure those checks.
docs/security.md explains every rule below.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Role = Literal["queuemaster", "renderer", "spark_bridge", "web", "operator", "client"]
NOTHING = "^$"  # RabbitMQ has no "deny" pattern: a regex only the empty name matches grants nothing
UUID = "[0-9a-f]{32}"
ACCOUNT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"


class Account(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=ACCOUNT_NAME)
    role: Role


class Deployment(BaseModel):
    """The description file (TOML)::

        vhost = "toposm"
        exchange_prefix = ""          # the deployment's QBROKER_EXCHANGE_PREFIX
        secrets_dir = "secrets"       # generated passwords, one file per account (relative to this file)

        [[account]]
        name = "toposm-queuemaster"
        role = "queuemaster"          # queuemaster | renderer | spark_bridge | web | operator | client
    """

    model_config = ConfigDict(extra="forbid")

    vhost: str = Field(min_length=1)
    exchange_prefix: str = ""
    secrets_dir: Path = Path("secrets")
    account: list[Account] = Field(min_length=1)

    def users(self, role: Role) -> list[str]:
        return [a.name for a in self.account if a.role == role]


class DescriptionError(ValueError):
    """The description file is unreadable or invalid."""


def load_deployment(path: Path) -> Deployment:
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


def permissions_for(role: Role, prefix: str) -> Permissions:
    """The broker permissions of one role (``prefix`` is the deployment's exchange prefix)."""
    p = re.escape(prefix)
    exchanges = f"{p}(rpc|reply|alert|dead)"
    # Every unit declares the four exchanges (with ``dead`` as alternate exchange: write on it, read on
    # the declared one), the shared ``dead`` queue (name = the dead exchange's), and its own exclusive
    # reply_/alert_ queues. Exclusive queues cannot be consumed by another connection, so a pattern over
    # every uuid does not let one unit read another's replies.
    base = [exchanges, f"{p}(reply|alert)_{UUID}"]
    # The kept copies of dead messages: every unit declares the `dead.kept.in` exchange and the `dead.kept`
    # queue and binds them; only operators read the queue (the copies hold other accounts' requests).
    kept_in, kept = rf"{p}dead\.kept\.in", rf"{p}dead\.kept"
    served = {
        "queuemaster": [rf"{p}rpc_toposm\.queuemaster", "osm", r"toposm\.queuemaster\.osm"],
        # and the seed's wire: `osm` and the process's broker-named queue there (services/tiles/renderer/osm_side.py)
        "renderer": [rf"{p}rpc_{RENDER_ANY}", "osm", r"amq\.gen-[A-Za-z0-9_-]+"],
        # and `osm`, where its expirations go too (the seed's wire)
        "spark_bridge": [rf"{p}rpc_spark\.(expire|stats|job)", "osm"],
        # The seed wire: a client declares `osm` and a server-named reply queue of its own.
        # (or one of the documented client prefix, services/tiles/seed_wire.py)
        "client": ["osm", r"amq\.gen-[A-Za-z0-9_-]+", r"toposm\.reply\.[A-Za-z0-9_-]+"],
        # toposm-web: its exclusive server-named queue on `osm`, bound to expire_toposm (expiry_wires.py)
        "web": ["osm", r"amq\.gen-[A-Za-z0-9_-]+"],
        "operator": [],
    }[role]
    if role == "operator":
        # A person with the CLI (call, alert, list, debug snooping): any resource, limited by topic rules.
        return Permissions(".*", ".*", ".*", _topics(role))
    # Endpoint retries wait in qbroker.retry.<name>.<ms> queues (declared and bound by the server itself).
    retries = [rf"{p}qbroker\.retry\.({name})\.[0-9]+" for name in _ROLE_TOPICS.get(role, {}).get("serve", [])]
    resources = _any(*base, *served, *retries, kept_in, kept)
    # Publishing on the default exchange reaches any queue by name, past every topic permission: only the
    # queuemaster gets it (the seed wire answers on it).
    write = _any(*base, *served, *retries, kept_in, kept, "amq\\.default") if role == "queuemaster" else resources
    return Permissions(resources, write, _any(*base, *served, *retries, kept_in), _topics(role))


# Per role: names it may call (publish on `rpc`) and serve (bind on `rpc`), and what else it may publish
# and hear on `alert`. Serving a name also means hearing `qbroker.broadcast.<name>` on `alert` (every
# server of a name answers a broadcast to it), so calling and serving are granted on both exchanges.
# A host word without '*' or '#': topic read is checked on the binding key itself, and a renderer
# binding `toposm.render.*.1.0` would receive other hosts' render commands.
WORD = r"[^.*#]+"
# The levels above the threads (toposm.render, .<host>, .<host>.<pid>) are endpoints too: a request
# there reaches one idle thread below (the seed's hierarchy), and any of them is "a render thread".
RENDER_LEVELS = r"toposm\.render(\." + WORD + r"(\.[0-9]+)?)?"
RENDER_ANY = r"toposm\.render(\." + WORD + r"(\.[0-9]+(\.[0-9]+)?)?)?"
SPARK = r"spark\.(expire|stats|job)"
_ROLE_TOPICS: dict[str, dict[str, list[str]]] = {
    "queuemaster": {"call": [RENDER_ANY], "serve": [r"toposm\.queuemaster"],
                    # expirations heard on one wire only are relayed to the other (services/tiles/expiry_wires.py)
                    "alert": ["toposm", "expire_toposm"], "hear": ["toposm", "expire_toposm"],
                    "osm_write": ["toposm", "expire_toposm"],
                    "osm_read": [r"toposm\.queuemaster", "expire_toposm", "toposm"]},
    "renderer": {"call": [r"toposm\.queuemaster"], "serve": [RENDER_ANY],
                 # listens on every level of toposm.render.<host>.<pid>.<thread> (the seed's hierarchy)
                 "alert": [], "hear": [r"toposm(\.render(\." + WORD + r"){0,3})?"],
                 # on the seed's wire too: registers and reports to the queuemaster, hears the same levels
                 "osm_write": [r"toposm\.queuemaster"], "osm_read": [r"toposm(\.render(\." + WORD + r"){0,3})?"]},
    "spark_bridge": {"call": [], "serve": [SPARK], "alert": ["expire_toposm", r"spark\.progress\.[0-9a-f]+"],
                     "hear": [], "osm_write": ["expire_toposm"], "osm_read": []},
    # toposm-web: the queuemaster's stats/render/expire (TOPOSM_EXPIRE_USERS lists it, for the map's
    # re-render), the Spark job list, and the expirations and job progress it shows; it serves nothing.
    "web": {"call": [r"toposm\.queuemaster", r"spark\.job"], "serve": [], "alert": [],
            "hear": [r"spark\.progress\.#", "expire_toposm"], "osm_write": [], "osm_read": ["expire_toposm"]},
    "client": {"call": [r"toposm\.queuemaster", SPARK], "serve": [], "alert": [],
               # discovery and job progress; not qbroker.broadcast.*, which are requests to servers
               # `qbroker call` follows `<first word of the name>.progress.#` while its call runs
               "hear": [WORD + r"\.progress\..+", r"qbroker\.(start|stop)"],
               # toposm-web hears expirations on the seed's wire too
               "osm_write": [r"toposm\.queuemaster"], "osm_read": ["expire_toposm"]},
}


def _broadcast(names: list[str]) -> list[str]:
    return [r"qbroker\.broadcast\." + name for name in names]


def _topics(role: Role) -> dict[str, tuple[str, str]]:
    """(write, read) routing-key patterns on each topic exchange (the prefix does not change names)."""
    if role == "operator":
        # Everything but what only the queuemaster sends: `render`/`ping` to render threads.
        # (control alerts to toposm.render.* are the operator's to send; broadcast requests to threads are not)
        not_render = r"^(?!qbroker\.broadcast\.toposm\.render($|\.)).*$"
        return {"rpc": (r"^(?!toposm\.render($|\.)).*$", ".*"), "alert": (not_render, ".*"), "osm": (".*", ".*")}
    t = _ROLE_TOPICS[role]
    lifecycle = r"qbroker\.(start|stop|ping)"  # every unit announces itself and answers qbroker.ping
    # A server re-publishes a redelivered request to its own name (with its failure count, qbroker.rpc),
    # so it may publish to the names it serves on shared queues; a refused re-publish would close its
    # channel and redeliver the request again, forever. Not to single threads: their queues are exclusive
    # (never redelivered elsewhere). What a renderer may so send to a level, other renderers refuse unless
    # it comes from the queuemaster's account (TOPOSM_QUEUEMASTER_USERS).
    republish = [RENDER_LEVELS] if role == "renderer" else t["serve"]

    def rule(names: list[str]) -> str:
        return _any(*names) if names else NOTHING

    # A failed request parked for a retry goes out on `rpc` as qbroker.retry.<ms>.<name> (qbroker.rpc): the
    # server may publish (and bind its delay queue) with the names it serves, nothing else.
    retry = [r"qbroker\.retry\.[0-9]+\.(" + name + ")" for name in t["serve"]]
    return {
        "rpc": (rule([*t["call"], *republish, *retry]), rule([*t["serve"], *retry])),
        "alert": (rule([lifecycle, *t["alert"], *_broadcast(t["call"])]),
                  rule([r"qbroker\.ping", *t["hear"], *_broadcast(t["serve"])])),
        "osm": (rule(t["osm_write"]), rule(t["osm_read"])),
    }


def service_env(deployment: Deployment) -> dict[str, str]:
    """What the receivers check against ``user_id`` (the part the broker cannot see)."""
    return {
        "TOPOSM_RENDERER_USERS": ",".join(deployment.users("renderer")),
        "TOPOSM_QUEUEMASTER_USERS": ",".join(deployment.users("queuemaster")),
        "TOPOSM_OPERATOR_USERS": ",".join(deployment.users("operator")),
        "TOPOSM_EXPIRE_USERS": ",".join(deployment.users("spark_bridge") + deployment.users("web")
                                        + deployment.users("operator")),
    }
