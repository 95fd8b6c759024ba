"""``qbroker call`` as a subprocess against a running example unit: bodies, output and exit codes."""

from __future__ import annotations

from tests.qbroker.cli.conftest import Example
from tests.qbroker.cli.helpers import run_cli


async def test_key_value_parsing_and_types(amqp_url: str, example: Example) -> None:
    result = await run_cli(
        amqp_url,
        "call",
        "clitest.types",
        "zoom=15",
        "ratio=0.5",
        "ok=true",
        "none=null",
        'tiles=["1/0/0"]',
        "name=Berlin",
        'quoted="15"',
        "expr=a=b",
    )
    assert result.code == 0, result.stderr
    reply = result.json()
    assert reply["params"] == {
        "zoom": 15,
        "ratio": 0.5,
        "ok": True,
        "none": None,
        "tiles": ["1/0/0"],
        "name": "Berlin",
        "quoted": "15",
        "expr": "a=b",
    }
    assert reply["types"]["zoom"] == "int" and reply["types"]["quoted"] == "str"
    assert reply["debug"] is False


async def test_command_endpoint_with_command_word(amqp_url: str, example: Example) -> None:
    stats = await run_cli(amqp_url, "call", "clitest.tiles", "stats")
    assert (stats.code, stats.json()) == (0, {"queued": 0})
    render = await run_cli(amqp_url, "call", "clitest.tiles", "render", "tile=15/1/2", "zoom=15", 'tiles=["1/0/0"]')
    assert render.code == 0, render.stderr
    assert render.json() == {"tile": "15/1/2", "zoom": 15, "tiles": ["1/0/0"]}


async def test_json_from_stdin_and_merge(amqp_url: str, example: Example) -> None:
    piped = await run_cli(amqp_url, "call", "clitest.echo", "--json", "-", stdin='{"text": "ab", "times": 2}')
    assert (piped.code, piped.json()) == (0, {"text": "abab"})
    # Piped output is plain JSON (no ANSI colour codes); --raw is one compact line.
    assert "\x1b[" not in piped.stdout
    merged = await run_cli(amqp_url, "call", "clitest.echo", "--json", '{"text": "x", "times": 1}', "times=3", "--raw")
    assert merged.code == 0
    assert merged.stdout == '{"text":"xxx"}\n'


async def test_raw_string_reply_is_unquoted(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "call", "clitest.string", "--raw")
    assert (result.code, result.stdout) == (0, "plain text\n")
    quoted = await run_cli(amqp_url, "call", "clitest.string")
    assert quoted.stdout == '"plain text"\n'


async def test_warn_exits_zero_with_warning_on_stderr(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "call", "clitest.warn")
    assert result.code == 0
    assert result.json() == {"done": 1}
    assert result.stderr.strip() == "qbroker: warning: partial: only half done"


async def test_error_exits_one(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "call", "clitest.boom")
    assert result.code == 1
    assert result.stdout == ""
    assert result.stderr.strip() == "qbroker: error: db_down: database unavailable"


async def test_fail_exits_two(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "call", "clitest.bad")
    assert (result.code, result.stderr.strip()) == (2, "qbroker: fail: bad_tile: tile out of range")
    invalid = await run_cli(amqp_url, "call", "clitest.echo", "times=x")
    assert invalid.code == 2
    assert "invalid_params" in invalid.stderr and "text" in invalid.stderr and "times" in invalid.stderr
    missing = await run_cli(amqp_url, "call", "clitest.no_such_endpoint")
    assert missing.code == 2 and "no_server" in missing.stderr


async def test_timeout_exits_three(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "call", "clitest.slow", "seconds=1.5", "--timeout", "0.5")
    assert result.code == 3  # had it waited for the late reply, it would exit 0 with "late"
    assert "call_timeout" in result.stderr and "Traceback" not in result.stderr


async def test_no_broker_exits_three(amqp_url: str) -> None:
    result = await run_cli("amqp://guest:guest@127.0.0.1:1/", "call", "clitest.echo", "text=x")
    assert result.code == 3
    lines = result.stderr.strip().splitlines()
    assert lines == ["qbroker: no broker reachable at amqp://guest:***@127.0.0.1:1/: connection refused"]  # redacted


async def test_url_option_beats_environment_and_failover_list(amqp_url: str, example: Example) -> None:
    # First URL is dead, the second is the test broker: the comma-separated list fails over.
    urls = f"amqp://guest:guest@127.0.0.1:1/,{amqp_url}"
    result = await run_cli("amqp://nobody@127.0.0.1:1/", "--url", urls, "call", "clitest.echo", "text=ok")
    assert (result.code, result.json()) == (0, {"text": "ok"})


async def test_debug_shows_remote_traceback(amqp_url: str, example: Example) -> None:
    plain = await run_cli(amqp_url, "call", "clitest.crash")
    assert plain.code == 1 and "Traceback" not in plain.stderr
    debug = await run_cli(amqp_url, "call", "clitest.crash", "--debug")
    assert debug.code == 1
    assert "remote traceback" in debug.stderr and "ZeroDivisionError" in debug.stderr
    flag = await run_cli(amqp_url, "call", "clitest.types", "--debug")
    assert flag.json()["debug"] is True


async def test_usage_errors_exit_64_without_connecting(amqp_url: str) -> None:
    for args in (
        ("call", "clitest.echo", "one", "two"),  # two bare words: only one command allowed
        ("call", "clitest.echo", "a=1", "a=2"),  # repeated key
        ("call", "clitest.echo", "--json", "{not json"),
        ("call", "clitest.echo", "--json", "[1]", "a=1"),  # cannot merge into a list
        ("call", "clitest.echo", "--no-such-option"),
    ):
        result = await run_cli("amqp://guest:guest@127.0.0.1:1/", *args)
        assert result.code == 64, (args, result.stderr)
        assert "no broker" not in result.stderr


async def test_help_has_examples(amqp_url: str) -> None:
    """(How fast ``--help`` starts is measured by bench/cli.py.)"""
    result = await run_cli(amqp_url, "--help")
    assert result.code == 0 and "qbroker call toposm.queuemaster stats" in result.stdout
    for command in ("call", "alert", "list"):
        sub = await run_cli(amqp_url, command, "--help")
        assert sub.code == 0 and "Examples" in sub.stdout, command


async def test_exchange_prefix_option_and_environment(amqp_url: str, make_unit: object) -> None:
    unit = await make_unit("clitest.prefixed", exchange_prefix="pfx.")  # type: ignore[operator]

    @unit.rpc("clitest.where")
    async def where() -> str:
        return "prefixed"

    await unit.start()
    # A dead-letter collector on the plain exchanges (the CLI's own unit does not collect): a call that
    # misses the prefix is then answered no_server at once, never left to time out.
    collector = await make_unit("clitest.collector", dead_letters=True)  # type: ignore[operator]
    await collector.start()
    by_option = await run_cli(amqp_url, "--exchange-prefix", "pfx.", "call", "clitest.where", "--raw")
    assert (by_option.code, by_option.stdout) == (0, "prefixed\n")
    by_env = await run_cli(amqp_url, "call", "clitest.where", "--raw", QBROKER_EXCHANGE_PREFIX="pfx.")
    assert (by_env.code, by_env.stdout) == (0, "prefixed\n")
    # Without the prefix the request goes to the plain `rpc` exchange, where nobody serves it.
    plain = await run_cli(amqp_url, "call", "clitest.where", "--timeout", "20")
    assert plain.code == 2, plain.stderr
    assert "no_server" in plain.stderr


async def test_notify_says_when_a_server_took_the_request(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "call", "clitest.echo", "text=hi", "--notify", "--guarantee")
    assert result.code == 0 and result.json() == {"text": "hi"}
    assert f"delivered to clitest.example {example.unit.uuid}" in result.stderr
    nobody = await run_cli(amqp_url, "call", "clitest.nobody", "--notify")
    assert nobody.code == 2 and "delivered to" not in nobody.stderr and "no_server" in nobody.stderr
