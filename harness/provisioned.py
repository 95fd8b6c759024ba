"""A provisioned deployment on a vhost of its own (``provisioned``, ``as_role``): one account per role, made by
``qbroker provision``; a pytest plugin that tests/conftest.py loads, because the library's security tests
(tests/qbroker/security) and the services' (tests/services/security) both use it.

Account names carry a random prefix so parallel runs never collide; the accounts, their password files
and the vhost are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.broker import delete_vhost
from qbroker import Config, Unit
from qbroker.cli.cmd_provision import remove
from qbroker.cli.deployment import Deployment, load_deployment
from qbroker.cli.roles import load_roles

BIN = Path(sys.executable).parent
ROLES = ("queuemaster", "renderer", "renderer2", "spark_bridge", "web", "operator", "client")
HOST = "127.0.0.1:5672"


@dataclass
class Provisioned:
    deployment: Deployment
    names: dict[str, str]  # role key -> account name
    passwords: dict[str, Path]
    service_env: dict[str, str]  # the `services:` lines of `qbroker provision --env` (TOPOSM_*_USERS)

    def config(self, role: str, **overrides: Any) -> Config:
        """A unit config that logs in as ``role``'s account, password from its file (not the URL)."""
        return Config(
            url=f"amqp://{HOST}/{self.deployment.vhost}",
            username=self.names[role],
            password_file=self.passwords[role],
            **overrides,
        )

    def url_with_password(self, role: str) -> str:
        password = self.passwords[role].read_text().strip()
        return f"amqp://{self.names[role]}:{password}@{HOST}/{self.deployment.vhost}"


@pytest.fixture(scope="session")  # rabbitmqctl is slow (a VM start per step): provision once per run
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provisioned]:
    tag = uuid.uuid4().hex[:8]
    base = tmp_path_factory.mktemp("deployment")
    names = {role: f"t{tag}-{role}" for role in ROLES}
    accounts = "".join(f'[[account]]\nname = "{name}"\nrole = "{role.rstrip("2")}"\n\n' for role, name in names.items())
    description = base / "deployment.toml"
    description.write_text(f'vhost = "qbroker-sec-{tag}"\nsecrets_dir = "secrets"\n\n{accounts}')
    deployment = load_deployment(description, load_roles())  # the roles the installed services register
    try:
        # The real command line, as an operator would run it.
        done = subprocess.run(
            [str(BIN / "qbroker"), "provision", str(description), "--env"], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        passwords = {role: deployment.secrets_dir / f"{name}.password" for role, name in names.items()}
        for path in passwords.values():
            password = path.read_text().strip()
            assert path.stat().st_mode & 0o077 == 0  # owner-only
            assert password not in done.stdout + done.stderr  # never printed
        services = done.stdout.split("\nservices:\n", 1)[1]
        env = dict(line.strip().split("=", 1) for line in services.splitlines() if line.strip())
        yield Provisioned(deployment, names, passwords, env)
    finally:
        remove(deployment)
        delete_vhost(deployment.vhost)


@pytest.fixture
async def as_role(provisioned: Provisioned) -> AsyncIterator[Any]:
    """``await as_role("client")``: a started unit logged in as that role's account (stopped afterwards)."""
    units: list[Unit] = []

    async def make(role: str, app: str | None = None, start: bool = True, **overrides: Any) -> Unit:
        unit = Unit(app or f"test.{role}", config=provisioned.config(role, **overrides))
        units.append(unit)
        if start:
            await unit.start()
        return unit

    yield make
    for unit in reversed(units):
        with contextlib.suppress(Exception):
            await unit.stop(drain_timeout=1)
        with contextlib.suppress(Exception):
            await unit.kill()
