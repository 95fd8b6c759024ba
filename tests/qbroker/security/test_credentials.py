"""Credentials: passwords come from the environment or a file, never from the command line,
and never show in logs, error messages, process arguments or the process environment."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
import structlog

from harness import HANG, eventually
from harness.provisioned import BIN, HOST
from qbroker import BrokerUnavailable, Config, Unit


async def test_account_from_environment_and_password_file(provisioned, monkeypatch) -> None:
    monkeypatch.setenv("QBROKER_URL", f"amqp://{HOST}/{provisioned.deployment.vhost}")
    monkeypatch.setenv("QBROKER_USERNAME", provisioned.names["client"])
    monkeypatch.setenv("QBROKER_PASSWORD_FILE", str(provisioned.passwords["client"]))
    config = Config()
    assert "@" not in config.url and config.password_file == provisioned.passwords["client"]
    unit = Unit("test.env.client", config=config)
    await unit.start()
    try:
        assert unit.bus.supervisor.user == provisioned.names["client"]
        replies = [r async for r in unit.gather("qbroker.ping", {}, timeout=5, max_replies=1)]
        assert replies  # our own unit answers: connected, declared, consuming as the client account
    finally:
        await unit.stop()


async def test_password_never_in_logs_or_errors(provisioned) -> None:
    secret = "not-the-password-7f3a9c"
    wrong = Path(str(provisioned.passwords["client"]) + ".wrong")
    wrong.write_text(secret + "\n")
    try:
        config = Config(
            url=f"amqp://{HOST}/{provisioned.deployment.vhost}",
            username=provisioned.names["client"],
            password_file=wrong,
            connect_timeout=5,
        )
        in_url = Config(
            url=f"amqp://{provisioned.names['client']}:{secret}@{HOST}/{provisioned.deployment.vhost}",
            connect_timeout=5,
        )
        with structlog.testing.capture_logs() as logs:
            with pytest.raises(BrokerUnavailable) as info:
                await Unit("test.wrong.password", config=config).start()
            with pytest.raises(BrokerUnavailable) as info_url:
                await Unit("test.wrong.password.url", config=in_url).start()
    finally:
        wrong.unlink()
    unreachable = [entry for entry in logs if entry["event"] == "broker unreachable"]
    assert len(unreachable) == 2  # the failures were logged (with the redacted URL and the reason)...
    for text in (str(info.value), str(info_url.value), *map(repr, logs)):
        assert secret not in text  # ... never with the password


async def test_unreadable_password_file_is_a_clear_error(tmp_path) -> None:
    config = Config(url=f"amqp://{HOST}/", username="x", password_file=tmp_path)  # a directory
    with pytest.raises(ValueError, match=r"password file .*: cannot read \(IsADirectoryError\)"):
        await Unit("test.pwfile", config=config).start()


async def test_service_process_holds_no_password_in_arguments_or_environment(provisioned, as_role, tmp_path) -> None:
    password = provisioned.passwords["queuemaster"].read_text().strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")}
    env.update(
        QBROKER_URL=f"amqp://{HOST}/{provisioned.deployment.vhost}",
        QBROKER_USERNAME=provisioned.names["queuemaster"],
        QBROKER_PASSWORD_FILE=str(provisioned.passwords["queuemaster"]),
    )
    log = (tmp_path / "qm.log").open("w")
    qm = subprocess.Popen(
        [
            str(BIN / "toposm-queuemaster"),
            "--tile-root",
            str(tmp_path / "tiles"),
            "--state-file",
            str(tmp_path / "q.sqlite"),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        client = await as_role("client")

        async def answers() -> dict:
            return await client.call("toposm.queuemaster", {"command": "stats"}, timeout=5)

        stats = await eventually(answers, timeout=HANG)
        assert stats["command"] == "stats"
        cmdline = Path(f"/proc/{qm.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{qm.pid}/environ").read_bytes()
        assert password.encode() not in cmdline and password.encode() not in environ
    finally:
        qm.terminate()
        await asyncio.to_thread(qm.wait, 30)
        log.close()
    assert password not in (tmp_path / "qm.log").read_text()
