"""An app's code for ``qbroker asyncapi tests.qbroker.cli.asyncapi_app:make_service`` (no broker needed)."""

from __future__ import annotations

from pydantic import BaseModel

from qbroker import Unit


class Point(BaseModel):
    x: int
    y: int


class Shape(BaseModel):
    name: str
    points: list[Point]


def make_service(unit: Unit) -> None:
    @unit.rpc("apidoc.area")
    async def area(shape: Shape) -> float:
        return 0.0

    @unit.rpc("apidoc.add")
    async def add(a: int, b: int = 1) -> int:
        return a + b

    admin = unit.commands("apidoc.admin")

    @admin.command("stats")
    async def stats(verbose: bool = False) -> dict[str, int]:
        return {}

    @admin.command("draw")  # a command with a nested model: its $defs go to the components too
    async def draw(shape: Shape) -> int:
        return len(shape.points)

    @unit.on_alert("apidoc.news.*")
    async def news(headline: str) -> None:
        return None
