"""Roles as data: what an account of each role may call, serve, publish and hear, from the services that own them.

The library knows two roles of its own: ``operator`` (a person with the CLI: everything but the names some role
reserves for itself) and ``client`` (hears presence and its own jobs' progress; the services add what it may
call). Every
other role, and every grant a service adds to these two, comes from

- the ``qbroker.roles`` entry points of the installed packages: each names a mapping ``{role: grants}`` (or a
  function returning one), e.g. in a service's pyproject.toml::

      [project.entry-points."qbroker.roles"]
      tiles = "services.toposm.roles:ROLES"

- TOML files given to ``qbroker provision --roles FILE``, one ``[role.<name>]`` table per role (the same keys).

A role named by several sources gets the union of their grants, so a service adds to a role another one
defines (the Spark bridge lets ``client`` call its endpoints). Names are regexes over routing keys and
resource names, matched whole; ``{account}`` in a routing-key name is the account's own word (``ACCOUNT``).
No role may configure the bus's shared exchanges and queues, whatever its ``resources`` say
(``qbroker.cli.deployment``); ``topics`` on an exchange let the role publish (write) and bind (read) there.
``qbroker provision --roles-only`` prints the merged table and where each role came from.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENTRY_POINT_GROUP = "qbroker.roles"
ROLE_NAME = r"^[a-z][a-z0-9_]{0,31}$"
WORD = r"[^.*#]+"  # one routing-key word, no wildcard: what a host or job id may be in a pattern
# In a role's routing-key pattern: the account's own word (qbroker.progress.owner_word, regex-escaped), filled
# in per account by `qbroker provision`. Not RabbitMQ's own `{username}`, which it puts into the regex as
# the name is, unescaped, where a dot matches any character, and which is not the word a routing key carries.
ACCOUNT = "{account}"


class RoleError(ValueError):
    """A role source is unreadable or invalid; the message names the source and the problem."""


def _patterns(values: list[str]) -> list[str]:
    for value in values:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regex ({exc})") from None
    return values


class TopicGrant(BaseModel):
    """Routing keys one may publish (``write``) and bind (``read``) on a topic exchange."""

    model_config = ConfigDict(extra="forbid")

    write: list[str] = Field(default_factory=list)
    read: list[str] = Field(default_factory=list)

    _regexes = field_validator("write", "read")(_patterns)


class Grants(BaseModel):
    """What a role's accounts may do, beyond what every unit may (its own exchanges, reply and alert queues,
    announcing itself, answering ``qbroker.ping``)."""

    model_config = ConfigDict(extra="forbid")

    call: list[str] = Field(default_factory=list)  # names it calls (rpc write, broadcast on alert)
    serve: list[str] = Field(default_factory=list)  # names it serves (rpc read, their queues and retries)
    # names it re-publishes a redelivered request to (default: ``serve``; a shared level above exclusive ones)
    republish: list[str] | None = None
    alert: list[str] = Field(default_factory=list)  # alerts it sends
    hear: list[str] = Field(default_factory=list)  # alerts it hears
    resources: list[str] = Field(default_factory=list)  # more exchanges/queues it declares and uses (no prefix)
    topics: dict[str, TopicGrant] = Field(default_factory=dict)  # other topic exchanges (no prefix)
    default_exchange: bool = False  # may publish on the default exchange (reaches any queue by name)
    reserved_calls: list[str] = Field(default_factory=list)  # names only this role calls, not even an operator
    listed_in: list[str] = Field(default_factory=list)  # environment variables listing this role's accounts
    everything: bool = False  # any resource; any name but the reserved ones (the operator)

    _regexes = field_validator("call", "serve", "republish", "alert", "hear", "resources", "reserved_calls")(
        lambda values: None if values is None else _patterns(values)
    )

    def merged(self, other: Grants) -> Grants:
        def union(a: list[str], b: list[str]) -> list[str]:
            return list(dict.fromkeys([*a, *b]))

        topics = dict(self.topics)
        for exchange, grant in other.topics.items():
            mine = topics.get(exchange, TopicGrant())
            topics[exchange] = TopicGrant(write=union(mine.write, grant.write), read=union(mine.read, grant.read))
        republish = (
            None
            if self.republish is None and other.republish is None
            else union(self.republish or [], other.republish or [])
        )
        return Grants(
            **{
                key: union(getattr(self, key), getattr(other, key))
                for key in ("call", "serve", "alert", "hear", "resources", "reserved_calls", "listed_in")
            },
            republish=republish,
            topics=topics,
            default_exchange=self.default_exchange or other.default_exchange,
            everything=self.everything or other.everything,
        )


# The library's own roles (docs/security.md). Services add to them; nothing here names a service.
BUILT_IN: dict[str, dict[str, Any]] = {
    "operator": {"everything": True},
    # discovery and the progress of its own jobs (qbroker.progress), not another account's; not
    # qbroker.broadcast.*, which are requests to servers. `qbroker call` follows
    # `<first word of the name>.progress.<its account>.#` while its call runs.
    "client": {"hear": [WORD + r"\.progress\." + ACCOUNT + r"\..+", r"qbroker\.(start|stop)"]},
}


class RoleBook:
    """The merged roles, and where each came from (``library``, ``entry point tiles``, ``file x.toml``)."""

    def __init__(self) -> None:
        self.roles: dict[str, Grants] = {}
        self.sources: dict[str, list[str]] = {}

    def add(self, source: str, table: object) -> None:
        if not isinstance(table, Mapping):
            raise RoleError(f"{source}: roles must be a table of role name -> grants, not {type(table).__name__}")
        for name, grants in table.items():
            if not isinstance(name, str) or not re.match(ROLE_NAME, name):
                raise RoleError(f"{source}: {name!r} is not a role name (lower case, digits, _)")
            try:
                parsed = Grants.model_validate(grants)
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise RoleError(f"{source}: role {name}: {problems}") from None
            known = self.roles.get(name)
            self.roles[name] = parsed if known is None else known.merged(parsed)
            self.sources.setdefault(name, []).append(source)

    def __getitem__(self, name: str) -> Grants:
        return self.roles[name]

    def __contains__(self, name: object) -> bool:
        return name in self.roles

    def reserved(self) -> list[str]:
        return [name for grants in self.roles.values() for name in grants.reserved_calls]

    def exchanges(self) -> list[str]:
        """The other topic exchanges any role has grants on."""
        return list(dict.fromkeys(e for grants in self.roles.values() for e in grants.topics))

    def listed_in(self) -> dict[str, list[str]]:
        """Environment variable -> the roles whose accounts it lists."""
        out: dict[str, list[str]] = {}
        for role, grants in self.roles.items():
            for variable in grants.listed_in:
                out.setdefault(variable, []).append(role)
        return dict(sorted(out.items()))


def _installed() -> Iterable[tuple[str, Callable[[], object]]]:
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        yield f"entry point {entry.name} ({entry.value})", entry.load


def load_roles(files: Iterable[Path] = (), *, installed: bool = True) -> RoleBook:
    """The library's roles, then the installed packages' (``installed``), then each file's, merged."""
    book = RoleBook()
    book.add("library", BUILT_IN)
    if installed:
        for source, load in _installed():
            try:
                table = load()
                table = table() if callable(table) else table
            except Exception as exc:  # noqa: BLE001 - a broken package is named, not a traceback
                raise RoleError(f"{source}: cannot load ({type(exc).__name__}: {exc})") from None
            book.add(source, table)
    for path in files:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise RoleError(f"{path}: cannot read ({type(exc).__name__})") from None
        except tomllib.TOMLDecodeError as exc:
            raise RoleError(f"{path}: not TOML: {exc}") from None
        if set(raw) - {"role"}:
            others = ", ".join(sorted(set(raw) - {"role"}))
            raise RoleError(f"{path}: only [role.<name>] tables belong in a roles file, not {others}")
        book.add(f"file {path}", raw.get("role", {}))
    return book
