"""``qbroker jobs list|status|cancel|watch``: the Spark bridge's jobs (the ``spark.job`` endpoint)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qbroker.cli.output import print_result, printable
from qbroker.cli.progress import ProgressView
from qbroker.cli.session import GlobalOptions, run_with_unit

if TYPE_CHECKING:
    from qbroker import Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker jobs list                         [dim]# newest first: id, kind, state, phase[/]

  qbroker jobs list --state running --json

  qbroker jobs status 3f2a9c...

  qbroker jobs watch 3f2a9c...              [dim]# progress until the job finishes[/]

  qbroker jobs cancel 3f2a9c...
"""

EndpointOption = Annotated[str, typer.Option("--endpoint", help="The job endpoint of the bridge.")]
JSONOption = Annotated[bool, typer.Option("--json", help="Print the reply as JSON instead of a table.")]
FINISHED = ("succeeded", "failed", "cancelled")

app = typer.Typer(
    help="List, inspect, watch and cancel Spark bridge jobs.",
    no_args_is_help=True,
    epilog=EXAMPLES,
    rich_markup_mode="rich",
)


def _table(jobs: list[dict[str, Any]]) -> None:
    if not jobs:
        sys.stdout.write("no jobs\n")
        return
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table("job", "kind", "state", "phase", "error")
        for job in jobs:
            table.add_row(
                *(escape(printable(str(job.get(k) or ""))) for k in ("job_id", "kind", "state", "phase", "error"))
            )
        Console().print(table)
        return
    for job in jobs:
        sys.stdout.write(
            "\t".join(printable(str(job.get(k) or "-")) for k in ("job_id", "kind", "state", "phase")) + "\n"
        )


def _run(ctx: typer.Context, action: Any, prepare: Any = None) -> None:
    options: GlobalOptions = ctx.obj
    raise typer.Exit(run_with_unit(options, action, prepare=prepare))


@app.command("list")
def list_jobs(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="queued, running, succeeded, failed or cancelled")] = None,
    kind: Annotated[str | None, typer.Option(help="expire or stats")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    endpoint: EndpointOption = "spark.job",
    as_json: JSONOption = False,
) -> None:
    """The bridge's jobs, newest first."""
    body: dict[str, Any] = {"command": "list", "limit": limit}
    if state:
        body["state"] = state
    if kind:
        body["kind"] = kind

    async def action(unit: Unit) -> int:
        reply = await unit.call(endpoint, body)
        jobs = reply.get("jobs", []) if isinstance(reply, dict) else []
        print_result(reply) if as_json else _table(jobs)
        return 0

    _run(ctx, action)


@app.command("status")
def status(ctx: typer.Context, job_id: str, endpoint: EndpointOption = "spark.job") -> None:
    """One job's record (state, phase, counters, times, error)."""

    async def action(unit: Unit) -> int:
        print_result(await unit.call(endpoint, {"command": "status", "job_id": job_id}))
        return 0

    _run(ctx, action)


@app.command("cancel")
def cancel(ctx: typer.Context, job_id: str, endpoint: EndpointOption = "spark.job") -> None:
    """Cancel a queued or running job."""

    async def action(unit: Unit) -> int:
        print_result(await unit.call(endpoint, {"command": "cancel", "job_id": job_id}, timeout=60))
        return 0

    _run(ctx, action)


@app.command("watch")
def watch(
    ctx: typer.Context,
    job_id: str,
    endpoint: EndpointOption = "spark.job",
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between status polls.")] = 1.0,
) -> None:
    """Show a job's progress until it finishes; exit 0 if it succeeded, 2 if it failed or was cancelled."""
    view = ProgressView(only_job=job_id)

    async def action(unit: Unit) -> int:
        while True:
            record = await unit.call(endpoint, {"command": "progress", "job_id": job_id})
            if isinstance(record, dict):
                await view.update(record)
                if record.get("state") in FINISHED:
                    view.close()
                    print_result(await unit.call(endpoint, {"command": "status", "job_id": job_id}))
                    return 0 if record.get("state") == "succeeded" else 2
            await asyncio.sleep(interval)

    try:
        _run(ctx, action, prepare=lambda unit: view.attach(unit, "spark"))
    finally:
        view.close()
