"""``qbroker asyncapi``: AsyncAPI 3.0 documents of an app's code and of the units on the bus, checked by
the official parser (@asyncapi/parser from the npm registry, installed by bin/ensure-asyncapi)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from qbroker import Unit
from tests.qbroker.cli.helpers import run_cli

ROOT = Path(__file__).resolve().parents[3]
VALIDATOR = Path(__file__).with_name("asyncapi_validate.cjs")


@functools.cache
def parser_dir() -> str:
    """The parser's directory; without npm a local run skips, CI (CI=true) fails: it must validate."""
    done = subprocess.run([str(ROOT / "bin/ensure-asyncapi")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        message = f"bin/ensure-asyncapi could not install @asyncapi/parser: {done.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return done.stdout.strip().splitlines()[-1]


def validate(path: Path) -> list[dict[str, Any]]:
    """The parser's diagnostics; fails the test on any error."""
    done = subprocess.run(
        ["node", str(VALIDATOR), parser_dir(), str(path)], capture_output=True, text=True, timeout=120
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    errors = [line for line in lines if line.get("severity") == 0]
    assert done.returncode == 0 and not errors, f"invalid AsyncAPI document: {errors or done.stderr}"
    return lines


async def test_document_of_an_apps_code_is_valid_asyncapi(amqp_url: str, tmp_path: Path) -> None:
    out = tmp_path / "api.json"
    result = await run_cli(amqp_url, "asyncapi", "tests.qbroker.cli.asyncapi_app:make_service", "-o", str(out))
    assert result.code == 0, result.stderr
    doc = json.loads(out.read_text())
    validate(out)
    assert doc["asyncapi"] == "3.0.0"
    area = doc["channels"]["rpc.apidoc.area"]
    assert area["address"] == "apidoc.area"
    assert area["bindings"]["amqp"]["exchange"]["type"] == "topic"
    messages = doc["components"]["messages"]
    shape = messages["apidoc.area.request"]["payload"]
    assert shape["required"] == ["name", "points"]  # the pydantic model, its $defs hoisted:
    assert shape["properties"]["points"]["items"]["$ref"] == "#/components/schemas/apidoc.area.request.Point"
    assert messages["apidoc.add.reply"]["payload"] == {"type": "integer"}
    variants = {v["properties"]["command"]["const"]: v for v in messages["apidoc.admin.request"]["payload"]["oneOf"]}
    assert "verbose" in variants["stats"]["properties"]
    draw = variants["draw"]
    assert draw["properties"]["points"]["items"] == {"$ref": "#/components/schemas/apidoc.admin.request.Point"}
    assert doc["channels"]["alert.apidoc.news.star"]["address"] == "apidoc.news.*"
    assert messages["apidoc.news.star.alert"]["payload"]["required"] == ["headline"]
    assert doc["operations"]["serve.apidoc.area"]["reply"]["channel"] == {"$ref": "#/channels/reply"}
    assert "ErrorElement" in doc["components"]["schemas"]


async def test_document_of_the_units_on_the_bus(make_unit: Any, amqp_url: str, tmp_path: Path) -> None:
    unit: Unit = await make_unit("apidoc.running")

    @unit.rpc("apidoc.live")
    async def live(n: int) -> int:
        return n

    await unit.start()
    out = tmp_path / "bus.json"
    result = await run_cli(amqp_url, "asyncapi", "--timeout", "1", "-o", str(out))
    assert result.code == 0, result.stderr
    validate(out)
    doc = json.loads(out.read_text())
    live_channel = doc["channels"]["rpc.apidoc.live"]
    assert "apidoc.running" in live_channel["description"]
    assert doc["components"]["messages"]["apidoc.live.request"]["payload"]["required"] == ["n"]
    assert "guest" not in out.read_text()  # the broker URL's credentials stay out of the document


class _Forged(Unit):
    """A unit that answers qbroker.ping with a description of its own making (any account may)."""

    forged: dict[str, Any] = {}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self.forged}


FORGED_DESCRIPTIONS: list[dict[str, Any]] = [
    {"endpoints": ["not", "an", "object"]},
    {"endpoints": {"forged.text": "not an object"}},
    {"endpoints": {"forged.ref": {"schema": {"$ref": "#/$defs/Missing"}}}},
    {"endpoints": {"forged.commands": {"commands": ["stats"]}}},
    {"endpoints": {"forged.required": {"commands": {"stats": {"required": [{"a": 1}]}}}}},
    {"endpoints": {"forged.required_number": {"commands": {"stats": {"required": 5}}}}},
    {"endpoints": {"forged.deep": {"schema": functools.reduce(lambda inner, _: {"a": inner}, range(200), {})}}},
    {"listeners": [5]},
    {"listeners": ["forged.alert"], "alerts": ["not", "an", "object"]},
]


async def test_forged_descriptions_are_left_out_not_fatal(make_unit: Any, amqp_url: str, tmp_path: Path) -> None:
    """Whatever a unit answers qbroker.ping with (a list for its endpoints, a $ref to nothing, a schema 200
    levels deep) is left out, named on stderr; the document of the other units is still written."""
    from qbroker import Config

    honest: Unit = await make_unit("apidoc.honest")

    @honest.rpc("apidoc.fine")
    async def fine(n: int) -> int:
        return n

    await honest.start()
    forgers = []
    try:
        for i, forged in enumerate(FORGED_DESCRIPTIONS):
            forger = _Forged(f"apidoc.forged{i}", config=Config(url=amqp_url))
            forger.forged = forged
            forgers.append(forger)
            await forger.start()
        out = tmp_path / "bus.json"
        result = await run_cli(amqp_url, "asyncapi", "--timeout", "2", "-o", str(out))
    finally:
        for forger in forgers:
            await forger.stop(drain_timeout=1)
    assert result.code == 0, result.stderr
    doc = json.loads(out.read_text())
    assert "rpc.apidoc.fine" in doc["channels"]
    assert not any("forged" in key for key in doc["channels"]), list(doc["channels"])
    for i in range(len(FORGED_DESCRIPTIONS)):
        assert f"apidoc.forged{i}" in result.stderr, result.stderr
    validate(out)
