"""``qbroker provision FILE`` / ``qbroker provision FILE --remove``: broker accounts for a deployment.

Applies the description (see ``qbroker.cli.deployment``) with ``rabbitmqctl`` on the broker host (why not
the management HTTP API: docs/decisions.md). Idempotent: run it again after editing the file and every
account's permissions are set anew; passwords already in the secrets dir are kept.

Passwords are generated here, written to ``<secrets_dir>/<account>.password`` (mode 0600) and handed to
rabbitmqctl on its standard input, so they never appear on a command line (``ps``), in a log or in an
error message. Services read them back with ``QBROKER_PASSWORD_FILE``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from qbroker.cli.deployment import Deployment, DescriptionError, load_deployment, permissions_for, service_env
from qbroker.cli.exit_codes import ExitCode

EXAMPLES = """
[bold]Examples[/]

  qbroker provision deploy/toposm.toml            [dim]# users, passwords, permissions[/]

  qbroker provision deploy/toposm.toml --env      [dim]# also print each account's environment[/]

  qbroker provision deploy/toposm.toml --remove   [dim]# delete the accounts again[/]
"""


class ProvisionError(RuntimeError):
    """rabbitmqctl refused a step (the message never holds a password)."""


def _ctl(*args: str, stdin: str | None = None, ok_codes: tuple[int, ...] = (0,)) -> int:
    exe = shutil.which("rabbitmqctl") or ("/usr/sbin/rabbitmqctl" if os.path.exists("/usr/sbin/rabbitmqctl") else None)
    if exe is None:
        raise ProvisionError("rabbitmqctl not found: run qbroker provision on the broker host (as root)")
    done = subprocess.run([exe, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode not in ok_codes:
        # Only the command word and user name: arguments are patterns, never secrets, but stay short.
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ProvisionError(f"rabbitmqctl {args[0]} failed: {detail[-1] if detail else done.returncode}")
    return done.returncode


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
    out = subprocess.run([exe, "list_vhosts", "-q", "--no-table-headers", "name"], capture_output=True,
                         text=True, timeout=60, check=False).stdout
    return vhost in {line.strip() for line in out.splitlines()}


def apply(deployment: Deployment) -> dict[str, Path]:
    """Create or update every account; returns each account's password file."""
    if not _vhost_exists(deployment.vhost):
        _ctl("add_vhost", deployment.vhost)
    files: dict[str, Path] = {}
    for account in deployment.account:
        path, password = password_for(deployment, account.name)
        files[account.name] = path
        # add_user exits 70 (EX_SOFTWARE) when the user exists: then set the password from the file.
        if _ctl("add_user", account.name, stdin=password, ok_codes=(0, 70)) != 0:
            _ctl("change_password", account.name, stdin=password)
        _ctl("set_user_tags", account.name)  # no management/administrator tags
        perms = permissions_for(account.role, deployment.exchange_prefix)
        _ctl("set_permissions", "-p", deployment.vhost, account.name, perms.configure, perms.write, perms.read)
        _ctl("clear_topic_permissions", "-p", deployment.vhost, account.name)
        for exchange, (write, read) in perms.topics.items():
            name = exchange if exchange == "osm" else deployment.exchange_prefix + exchange
            _ctl("set_topic_permissions", "-p", deployment.vhost, account.name, name, write, read)
    return files


def remove(deployment: Deployment, *, delete_secrets: bool = True) -> None:
    """Delete the accounts (and their password files); the vhost stays."""
    for account in deployment.account:
        _ctl("delete_user", account.name, ok_codes=(0, 67))  # 67: no such user
        if delete_secrets:
            (deployment.secrets_dir / f"{account.name}.password").unlink(missing_ok=True)


def provision(
    description: Annotated[Path, typer.Argument(help="The deployment's description (TOML).")],
    remove_accounts: Annotated[bool, typer.Option("--remove", help="Delete the accounts instead.")] = False,
    show_env: Annotated[bool, typer.Option("--env", help="Print each account's QBROKER_* environment.")] = False,
) -> None:
    """Create the broker accounts of a deployment: users, passwords, permissions and topic permissions."""
    try:
        deployment = load_deployment(description)
        if remove_accounts:
            remove(deployment)
            sys.stdout.write(f"removed {len(deployment.account)} accounts\n")
            return
        files = apply(deployment)
    except (DescriptionError, ProvisionError, OSError) as exc:
        sys.stderr.write(f"qbroker provision: {exc}\n")
        raise typer.Exit(int(ExitCode.ERROR)) from None
    for account in deployment.account:
        sys.stdout.write(f"{account.role:13} {account.name}\n")
        if show_env:
            sys.stdout.write(f"  QBROKER_USERNAME={account.name}\n  QBROKER_PASSWORD_FILE={files[account.name]}\n")
    if show_env:
        sys.stdout.write("services:\n")
        for key, value in service_env(deployment).items():
            sys.stdout.write(f"  {key}={value}\n")
