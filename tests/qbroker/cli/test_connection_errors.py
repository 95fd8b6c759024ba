"""Connection errors that say why, against the real RabbitMQ: a refused login, a refused vhost, a host that
does not resolve, a closed port and TLS to the plain port. Each is its own BrokerUnavailable subclass, and
every console script prints it as one line, exit 3, never with the password."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest

from harness.broker import create_vhost, delete_vhost, rabbitmqctl
from qbroker import (
    BrokerAuthRefused,
    BrokerConnectionRefused,
    BrokerHostUnknown,
    BrokerTlsFailed,
    BrokerUnavailable,
    BrokerVhostRefused,
    Config,
    Unit,
)
from tests.json_log_lines import json_lines
from tests.qbroker.cli.helpers import BIN, QBROKER, QBROKER_DEBUG, run_cli

PASSWORD = "right-" + uuid.uuid4().hex[:8]
WRONG = "wrong-" + uuid.uuid4().hex[:8]


@dataclass
class Case:
    kind: type[BrokerUnavailable]
    url: str
    says: str  # the start of the one line


@pytest.fixture(scope="module")
def account() -> Iterator[tuple[str, str]]:
    """A user of its own (with PASSWORD) on a vhost of its own; both removed afterwards."""
    vhost = create_vhost("qbroker-test-connerr")
    user = f"qbroker-test-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_user", user, PASSWORD)
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    try:
        yield user, vhost
    finally:
        rabbitmqctl("delete_user", user, check=False)
        delete_vhost(vhost)


@pytest.fixture(scope="module")
def closed() -> Iterator[str]:
    """A vhost that exists, on which the test's user has no permissions."""
    vhost = create_vhost("qbroker-test-noaccess")
    yield vhost
    delete_vhost(vhost)


@pytest.fixture(scope="module")
def cases(account: tuple[str, str], closed: str) -> dict[str, Case]:
    user, vhost = account
    gone = create_vhost("qbroker-test-gone")
    delete_vhost(gone)  # existed, now does not
    q = quote
    return {
        "auth": Case(
            BrokerAuthRefused,
            f"amqp://{user}:{WRONG}@127.0.0.1:5672/{q(vhost, safe='')}",
            f"authentication refused for user '{user}' at amqp://{user}:***@127.0.0.1:5672/{vhost} (ACCESS_REFUSED",
        ),
        "vhost": Case(
            BrokerVhostRefused,
            f"amqp://{user}:{PASSWORD}@127.0.0.1:5672/{q(gone, safe='')}",
            f"vhost '{gone}' not allowed for user '{user}' at amqp://{user}:***@127.0.0.1:5672/{gone} (NOT_ALLOWED",
        ),
        "no access": Case(
            BrokerVhostRefused,
            f"amqp://{user}:{PASSWORD}@127.0.0.1:5672/{q(closed, safe='')}",
            f"vhost '{closed}' not allowed for user '{user}'",
        ),
        "dns": Case(
            BrokerHostUnknown,
            f"amqp://{user}:{PASSWORD}@nonexistent.invalid/",
            f"cannot resolve host 'nonexistent.invalid' of amqp://{user}:***@nonexistent.invalid:5672/",
        ),
        "closed port": Case(
            BrokerConnectionRefused,
            f"amqp://{user}:{PASSWORD}@127.0.0.1:1/",
            f"no broker reachable at amqp://{user}:***@127.0.0.1:1/: connection refused",
        ),
        "tls": Case(
            BrokerTlsFailed,
            f"amqps://{user}:{PASSWORD}@127.0.0.1:5672/",
            f"TLS handshake failed with amqps://{user}:***@127.0.0.1:5672/ (",
        ),
    }


NAMES = ["auth", "vhost", "no access", "dns", "closed port", "tls"]


@pytest.mark.parametrize("name", NAMES)
async def test_start_raises_the_cause(cases: dict[str, Case], name: str) -> None:
    case = cases[name]
    with pytest.raises(BrokerUnavailable) as info:
        await Unit("test.connerr", config=Config(url=case.url, connect_timeout=5)).start()
    assert type(info.value) is case.kind
    assert info.value.message.startswith(case.says), info.value.message
    assert "\n" not in info.value.message
    assert PASSWORD not in str(info.value) and WRONG not in str(info.value)
    # a refused login or vhost will not pass by itself; the others may
    assert info.value.retryable is (case.kind not in (BrokerAuthRefused, BrokerVhostRefused))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("script", ["qbroker", "qbroker-debug"])
async def test_library_clis_print_one_line(cases: dict[str, Case], name: str, script: str) -> None:
    case = cases[name]
    args = ("list", "--timeout", "1") if script == "qbroker" else ()
    result = await run_cli(case.url, *args, exe=QBROKER if script == "qbroker" else QBROKER_DEBUG)
    assert result.code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: {case.says}"), result.stderr
    assert PASSWORD not in result.stderr and WRONG not in result.stderr


@pytest.mark.parametrize("name", NAMES)
async def test_service_runner_ends_with_the_cause(cases: dict[str, Case], name: str) -> None:
    """qbroker-dead-letter runs on qbroker.runner.serve, as the stack's services do."""
    case = cases[name]
    result = await run_cli(case.url, exe=str(BIN / "qbroker-dead-letter"), QBROKER_LOG_FORMAT="json")
    assert result.code == 3
    # Beside the log lines, one line says why it ends: in JSON mode a JSON line too (docs/logging.md).
    ours = [
        line["event"]
        for line in json_lines(result.stderr, "qbroker-dead-letter")
        if line["level"] == "critical" and line["event"].startswith("qbroker.dead_letter: ")
    ]
    assert len(ours) == 1 and ours[0].startswith(f"qbroker.dead_letter: {case.says}"), result.stderr
    assert PASSWORD not in result.stderr and WRONG not in result.stderr
