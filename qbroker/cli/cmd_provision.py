"""``qbroker provision FILE`` / ``qbroker provision FILE --remove``: broker accounts for a deployment.

Applies the description (see ``qbroker.cli.deployment``; the roles: ``qbroker.cli.roles``) with
``rabbitmqctl`` on the broker host (why not the management HTTP API: docs/decisions.md), and declares the
bus's shared exchanges and queues, which no role may (``qbroker.cli.provision_topology``). Idempotent: run it
again after editing the file and every account's permissions are set anew; passwords already in the secrets
dir are kept; shared objects that exist are kept as they are (what differs is named).

Passwords are generated here, written to ``<secrets_dir>/<account>.password`` (mode 0600) and handed to
rabbitmqctl on its standard input, so they never appear on a command line (``ps``), in a log or in an
error message. Services read them back with ``QBROKER_PASSWORD_FILE``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from qbroker.cli.deployment import Deployment, DescriptionError, load_deployment, permissions_for, service_env
from qbroker.cli.exit_codes import ExitCode
from qbroker.cli.provision_topology import compare, topology_for
from qbroker.cli.provision_topology import definitions as topology_definitions
from qbroker.cli.roles import RoleBook, RoleError, load_roles

EXAMPLES = """
[bold]Examples[/]

  qbroker provision deploy/toposm.toml            [dim]# users, passwords, permissions[/]

  qbroker provision deploy/toposm.toml --env      [dim]# also print each account's environment[/]

  qbroker provision deploy/toposm.toml --remove   [dim]# delete the accounts again[/]

  qbroker provision --list-roles --roles site.toml [dim]# the roles known here, and where from[/]
"""


EXCHANGE_COLUMNS = ("name", "type", "durable", "auto_delete", "arguments")
QUEUE_COLUMNS = ("name", "durable", "auto_delete", "arguments")


class ProvisionError(RuntimeError):
    """rabbitmqctl refused a step (the message never holds a password)."""


def _ctl(*args: str, stdin: str | None = None, ok_codes: tuple[int, ...] = (0,)) -> int:
    return _ctl_run(*args, stdin=stdin, ok_codes=ok_codes).returncode


def _ctl_run(
    *args: str, stdin: str | None = None, ok_codes: tuple[int, ...] = (0,)
) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("rabbitmqctl") or ("/usr/sbin/rabbitmqctl" if os.path.exists("/usr/sbin/rabbitmqctl") else None)
    if exe is None:
        raise ProvisionError("rabbitmqctl not found: run qbroker provision on the broker host (as root)")
    done = subprocess.run([exe, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode not in ok_codes:
        # Only the command word and user name: arguments are patterns, never secrets, but stay short.
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ProvisionError(f"rabbitmqctl {args[0]} failed: {detail[-1] if detail else done.returncode}")
    return done


def _listed(what: str, vhost: str, *columns: str) -> list[dict[str, Any]]:
    """``rabbitmqctl list_<what> -p vhost columns`` as JSON rows."""
    out = _ctl_run(f"list_{what}", "-p", vhost, *columns, "--formatter", "json", "-q").stdout
    try:
        rows = json.loads(out or "[]")
    except json.JSONDecodeError:
        return []  # the vhost is still being set up: asked again
    return rows if isinstance(rows, list) else []


def password_for(deployment: Deployment, account: str) -> tuple[Path, str]:
    """The account's password file and password, generating both on first use."""
    deployment.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = deployment.secrets_dir / f"{account}.password"
    if path.exists():
        return path, path.read_text(encoding="utf-8").rstrip("\r\n")
    password = secrets.token_urlsafe(24)
    # O_EXCL + 0600 from the start: the password is never readable by others, not even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(password + "\n")
    return path, password


def _vhost_exists(vhost: str) -> bool:
    exe = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    out = subprocess.run(
        [exe, "list_vhosts", "-q", "--no-table-headers", "name"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    return vhost in {line.strip() for line in out.splitlines()}


def password_hash(password: str) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password)), 4-byte salt.
    Only this hash leaves the process: the definitions carry no password."""
    salt = secrets.token_bytes(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode("utf-8")).digest()).decode("ascii")


def _give_to_broker_user(path: Path) -> None:
    try:
        import pwd

        broker = pwd.getpwnam("rabbitmq")
        os.chown(path, broker.pw_uid, broker.pw_gid)
    except (KeyError, PermissionError, ImportError):  # no such user, or not root: rabbitmqctl runs as us
        pass


def _existing_users() -> set[str]:
    exe = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    out = subprocess.run(
        [exe, "list_users", "-q", "--no-table-headers"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    return {line.split("\t")[0].strip() for line in out.splitlines() if line.strip()}


def apply(
    deployment: Deployment,
    roles: RoleBook,
    warn: Callable[[str], object] = lambda text: sys.stderr.write(f"qbroker provision: {text}\n"),
) -> dict[str, Path]:
    """Create or update every account and declare the bus's shared exchanges and queues; returns each
    account's password file. ``warn`` is told each way an existing shared object differs (it is kept).

    One ``rabbitmqctl import_definitions`` (definitions on standard input) sets every user, password hash,
    permission, topic permission, shared exchange, queue and binding at once: each rabbitmqctl call starts an
    Erlang VM, so a step per setting took a minute for a small deployment; this takes a few seconds."""
    if not _vhost_exists(deployment.vhost):
        _ctl("add_vhost", deployment.vhost)
    existing = _existing_users()
    files: dict[str, Path] = {}
    topology = topology_for(deployment, roles)
    definitions: dict[str, list[dict[str, Any]]] = {
        "users": [],
        "permissions": [],
        "topic_permissions": [],
        **topology_definitions(topology, deployment.vhost),
    }
    for account in deployment.account:
        path, password = password_for(deployment, account.name)
        files[account.name] = path
        if account.name in existing:  # topic permissions are merged by an import: drop the old ones first
            _ctl("clear_topic_permissions", "-p", deployment.vhost, account.name)
        definitions["users"].append(
            {
                "name": account.name,
                "password_hash": password_hash(password),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": "",
            }
        )  # no management/administrator tags
        perms = permissions_for(roles[account.role], roles, deployment.exchange_prefix, account.name)
        definitions["permissions"].append(
            {
                "user": account.name,
                "vhost": deployment.vhost,
                "configure": perms.configure,
                "write": perms.write,
                "read": perms.read,
            }
        )
        for exchange, (write, read) in perms.topics.items():
            # qbroker's own exchanges carry the deployment's prefix; the others are named as they are
            name = deployment.exchange_prefix + exchange if exchange in ("rpc", "alert") else exchange
            definitions["topic_permissions"].append(
                {"user": account.name, "vhost": deployment.vhost, "exchange": name, "write": write, "read": read}
            )
    # A 0600 file (it holds password hashes, never passwords). Debian's rabbitmqctl runs as the `rabbitmq`
    # user and reads no standard input for this command, so the file is handed to that user.
    with tempfile.TemporaryDirectory(prefix="qbroker-provision-") as tmp:
        os.chmod(tmp, 0o711)  # noqa: S103 - traverse only (no listing): the broker user reaches its own file
        path = Path(tmp) / "definitions.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(definitions, handle)
        _give_to_broker_user(path)
        _ctl("import_definitions", str(path))
    # The broker applies an import asynchronously: wait until every account and shared object exists before
    # anyone logs in (a unit would find the topology missing).
    wanted = {account.name for account in deployment.account}
    deadline = time.monotonic() + 60
    while not wanted <= _existing_users():
        if time.monotonic() > deadline:
            raise ProvisionError("the broker did not apply the accounts' definitions within 60 s")
        time.sleep(0.2)
    while (
        found := compare(
            topology,
            _listed("exchanges", deployment.vhost, *EXCHANGE_COLUMNS),
            _listed("queues", deployment.vhost, *QUEUE_COLUMNS),
        )
    ) is None:
        if time.monotonic() > deadline:
            raise ProvisionError("the broker did not declare the shared exchanges and queues within 60 s")
        time.sleep(0.2)
    for difference in found:
        warn(f"{difference}: kept as it is (an import changes no existing object); cost: {difference.cost()}")
    return files


def remove(deployment: Deployment, *, delete_secrets: bool = True) -> None:
    """Delete the accounts (and their password files); the vhost stays."""
    for account in deployment.account:
        _ctl("delete_user", account.name, ok_codes=(0, 67))  # 67: no such user
        if delete_secrets:
            (deployment.secrets_dir / f"{account.name}.password").unlink(missing_ok=True)


def _list_roles(roles: RoleBook) -> None:
    for name in sorted(roles.roles):
        grants = roles[name]
        sys.stdout.write(f"{name:13} from {', '.join(roles.sources[name])}\n")
        for key, value in grants.model_dump(exclude_defaults=True).items():
            sys.stdout.write(f"  {key} = {json.dumps(value)}\n")


def provision(
    description: Annotated[Path | None, typer.Argument(help="The deployment's description (TOML).")] = None,
    remove_accounts: Annotated[bool, typer.Option("--remove", help="Delete the accounts instead.")] = False,
    show_env: Annotated[bool, typer.Option("--env", help="Print each account's QBROKER_* environment.")] = False,
    role_files: Annotated[
        list[Path] | None,
        typer.Option(
            "--roles",
            help="More roles: a TOML file of [role.<name>] tables (repeatable). The installed services' "
            "roles (entry points qbroker.roles) are always read.",
        ),
    ] = None,
    list_roles: Annotated[
        bool, typer.Option("--list-roles", help="Print the roles known and where each comes from, and do nothing else.")
    ] = False,
) -> None:
    """Create the broker accounts of a deployment (users, passwords, permissions and topic permissions) and
    declare the bus's shared exchanges and queues."""
    try:
        if remove_accounts and description is not None:  # needs no roles: a role's package may be gone
            deployment = load_deployment(description)
            remove(deployment)
            sys.stdout.write(f"removed {len(deployment.account)} accounts\n")
            return
        roles = load_roles(role_files or [])
        if list_roles:
            _list_roles(roles)
            return
        if description is None:
            raise DescriptionError("give the deployment's description (or --list-roles)")
        deployment = load_deployment(description, roles)
        files = apply(deployment, roles)
    except (DescriptionError, RoleError, ProvisionError, OSError) as exc:
        sys.stderr.write(f"qbroker provision: {exc}\n")
        raise typer.Exit(int(ExitCode.ERROR)) from None
    for account in deployment.account:
        sys.stdout.write(f"{account.role:13} {account.name}\n")
        if show_env:
            sys.stdout.write(f"  QBROKER_USERNAME={account.name}\n  QBROKER_PASSWORD_FILE={files[account.name]}\n")
    if show_env:
        sys.stdout.write("services:\n")
        for key, value in service_env(deployment, roles).items():
            sys.stdout.write(f"  {key}={value}\n")
