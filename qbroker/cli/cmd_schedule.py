"""``qbroker schedule add|list|remove|serve``: schedules kept on the broker (qbroker.broker_scheduler)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qbroker.cli.exit_codes import ExitCode, UsageProblem
from qbroker.cli.output import print_result, printable
from qbroker.cli.session import GlobalOptions, run_with_unit, usage_guard
from qbroker.cli.values import build_body

if TYPE_CHECKING:
    from qbroker import Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker schedule serve &                                  [dim]# a scheduler (run two: one is standby)[/]

  qbroker schedule add toposm.queuemaster command=stats --every 60

  qbroker schedule add expire_toposm --alert --cron '*/5 * * * *' --json '"10/1/2"'

  qbroker schedule add nightly.report --cron '0 3 * * *' --nohaste --runs 7

  qbroker schedule list

  qbroker schedule remove 3f2a9c0b1d2e4f50
"""

app = typer.Typer(
    help="Schedules kept on the broker, sent by one active scheduler.",
    no_args_is_help=True,
    epilog=EXAMPLES,
    rich_markup_mode="rich",
)


def _when(timestamp: Any) -> str:
    if not isinstance(timestamp, int | float):
        return "-"
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command("add", no_args_is_help=True)
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The endpoint to cast to, or the alert to send (--alert).")],
    words: Annotated[list[str] | None, typer.Argument(help="The body: key=value pairs.")] = None,
    every: Annotated[float | None, typer.Option(help="Seconds between sends.")] = None,
    cron: Annotated[str | None, typer.Option(help="A five-field cron line (UTC).")] = None,
    alert: Annotated[bool, typer.Option("--alert", help="Send an alert instead of a cast.")] = False,
    nohaste: Annotated[bool, typer.Option(help="The first send waits one interval.")] = False,
    runs: Annotated[int | None, typer.Option(min=1, help="Stop after this many sends.")] = None,
    json_source: Annotated[str | None, typer.Option("--json", help="The body as JSON ('-': stdin).")] = None,
) -> None:
    """Add a schedule, or update the one that sends the same (name, kind, body)."""
    from pydantic import ValidationError

    from qbroker.broker_scheduler import ScheduleSpec, add_schedule

    options: GlobalOptions = ctx.obj
    holder: dict[str, ScheduleSpec] = {}

    def check() -> int:
        body = build_body(json_source, words or [], allow_command=True)
        try:
            holder["spec"] = ScheduleSpec(
                name=name,
                kind="alert" if alert else "cast",
                body=body,
                every=every,
                cron=cron,
                nohaste=nohaste,
                run_count=runs,
            )
        except ValidationError as exc:
            raise UsageProblem("; ".join(str(e["msg"]) for e in exc.errors())) from None
        return 0

    if code := usage_guard(check):
        raise typer.Exit(code)

    async def action(unit: Unit) -> int:
        schedule_id = await add_schedule(unit, holder["spec"])
        sys.stdout.write(schedule_id + "\n")
        return 0

    raise typer.Exit(run_with_unit(options, action))


@app.command("list")
def list_(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the schedulers.")] = 2.0,
) -> None:
    """The schedules, as the active scheduler holds them."""
    from qbroker.broker_scheduler import list_schedules

    async def action(unit: Unit) -> int:
        active, schedules = await list_schedules(unit, timeout=timeout)
        if as_json:
            print_result({"active": active, "schedules": schedules})
            return 0
        if active is None:
            sys.stderr.write("no active scheduler answered: start one with 'qbroker schedule serve'\n")
            return int(ExitCode.UNREACHABLE)
        if not schedules:
            sys.stdout.write("no schedules\n")
        for s in schedules:
            timing = f"every {s['every']}s" if s.get("every") else f"cron '{s.get('cron')}'"
            runs = f"{s['runs']}/{s['run_count']}" if s.get("run_count") else str(s["runs"])
            line = f"{s['id']}  {s['kind']:<5} {s['name']}  {timing}  runs {runs}  next {_when(s['next_due'])}"
            sys.stdout.write(printable(line) + "\n")  # the scheduler's answer: from the wire
        return 0

    raise typer.Exit(run_with_unit(ctx.obj, action))


@app.command("remove", no_args_is_help=True)
def remove(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument(help="The id 'add' printed.")]) -> None:
    """Remove a schedule (the active scheduler stops it at once)."""
    from qbroker.broker_scheduler import remove_schedule

    async def action(unit: Unit) -> int:
        await remove_schedule(unit, schedule_id)
        return 0

    raise typer.Exit(run_with_unit(ctx.obj, action))


@app.command("serve")
def serve_scheduler(
    ctx: typer.Context,
    owners: Annotated[
        list[str] | None, typer.Option("--owner", help="Only these broker accounts may change schedules (repeatable).")
    ] = None,
) -> None:
    """Run a scheduler until SIGTERM; several may run, one is active and the others stand by."""
    from qbroker.broker_scheduler import BrokerScheduler
    from qbroker.runner import serve

    options: GlobalOptions = ctx.obj
    config = options.config().model_copy(update={"dead_letters": True})
    serve(
        options.app_name(config, "qbroker.scheduler"), lambda unit: BrokerScheduler(unit, owners=owners), config=config
    )
