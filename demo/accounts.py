"""``bin/demo --accounts``: run the demo with one broker account per program, as a deployment would.

The accounts are made by ``qbroker provision`` (rabbitmqctl on this host) from a description written into
the work dir, used through ``QBROKER_USERNAME``/``QBROKER_PASSWORD_FILE`` (never a password in a URL or on
a command line), and deleted when the demo ends. docs/security.md describes the roles.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from demo.leftovers import DEPLOYMENT_FILE
from qbroker.cli.cmd_provision import apply, remove
from qbroker.cli.deployment import load_deployment, service_env
from qbroker.cli.roles import load_roles

ROLES = {
    "queuemaster": "queuemaster",
    "renderer": "renderer",
    "spark": "spark_bridge",
    "web": "web",
    "ops": "operator",
    "client": "client",
}


class DemoAccounts:
    def __init__(self, names: dict[str, str], files: dict[str, Path], services: dict[str, str]) -> None:
        self.names, self.files, self.services = names, files, services

    def env(self, program: str) -> dict[str, str]:
        """The environment of ``program`` (a key of ROLES): its account, and what its receivers check."""
        return {
            **os.environ,
            **self.services,
            "QBROKER_USERNAME": self.names[program],
            "QBROKER_PASSWORD_FILE": str(self.files[self.names[program]]),
        }


@contextlib.contextmanager
def demo_accounts(workdir: Path, url: str, prefix: str) -> Iterator[DemoAccounts]:
    parts = urlsplit(url.split(",")[0])
    vhost = unquote(parts.path[1:]) or "/"
    tag = uuid.uuid4().hex[:6]  # two demos on one broker never share accounts
    names = {program: f"demo-{tag}-{program}" for program in ROLES}
    # Kept until the accounts are deleted: a run killed before that leaves it for the next (demo/leftovers.py).
    description = workdir / DEPLOYMENT_FILE
    accounts = "".join(f'[[account]]\nname = "{names[p]}"\nrole = "{role}"\n\n' for p, role in ROLES.items())
    description.write_text(f'vhost = "{vhost}"\nexchange_prefix = "{prefix}"\nsecrets_dir = "secrets"\n\n{accounts}')
    roles = load_roles()  # the services' own roles, from their entry points
    deployment = load_deployment(description, roles)
    try:
        files = apply(deployment, roles)
        env = service_env(deployment, roles)
        # Only the person's account may send control alerts (the web account may expire: the map's re-render).
        env["TOPOSM_OPERATOR_USERS"] = names["ops"]
        yield DemoAccounts(names, files, env)
    finally:
        remove(deployment)
        description.unlink(missing_ok=True)
