"""Every program's ``/metrics`` as Prometheus scrapes it (docs/metrics.md): its build info with the installed
version, no ``_created`` series, no process id in any label value (a restarted renderer continues the same
series in the queuemaster's figures and its own), each program's names exactly the ones the docs list, and
what the Grafana dashboard queries of them there."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from harness import eventually
from harness.private_node import free_port
from services import toposm
from tests.grafana_dashboard import missing
from tests.metrics_docs import LIBRARY, documented, offered, own
from tests.prometheus_text import created_series, labels_naming, says_its_version, scrape, value
from tests.services.tiles.conftest import BIN, Proc, TileBus, wait_renderers
from tests.services.web.conftest import start_web

HOST = "metricshost"  # the renderers' --hostname: the word their labels keep across restarts


def replicate(bus: TileBus, port: int) -> Proc:
    """toposm-replicate following a replication directory into a PostGIS nobody listens for: every round
    fails (``postgis``) and is retried, the process stays up and counts."""
    source = bus.tmp / "replication"
    source.mkdir()
    (source / "state.txt").write_text("sequenceNumber=3\ntimestamp=2020-01-01T00\\:00\\:00Z\n")
    args = [
        str(BIN / "toposm-replicate"),
        "--source",
        str(source),
        "--start",
        "1",
        "--spool",
        str(bus.tmp / "spool"),
        "--postgis",
        f"host=127.0.0.1 port={free_port()} dbname=absent connect_timeout=2",
        "--interval",
        "0.2",
        "--max-backoff",
        "0.5",
        "--metrics-port",
        str(port),
    ]
    proc = Proc(args, bus.url, bus.tmp / "replicate.log")
    bus.procs.append(proc)
    return proc


def dead_letter(bus: TileBus, port: int) -> Proc:
    """The library's own collector as a TopOSM deployment runs it (docs/tiles.md)."""
    proc = Proc(
        [str(BIN / "qbroker-dead-letter"), "--hear", "toposm", "--metrics-port", str(port)],
        bus.url,
        bus.tmp / "dead-letter.log",
    )
    bus.procs.append(proc)
    return proc


async def test_every_program_says_its_version_and_keeps_its_series_across_restarts(bus: TileBus) -> None:
    qm_port, renderer_port, replicate_port, collector_port = free_port(), free_port(), free_port(), free_port()
    queuemaster = bus.queuemaster("--metrics-port", str(qm_port))
    first = bus.renderer("--metrics-port", str(renderer_port), "--hostname", HOST)
    follower = replicate(bus, replicate_port)
    collector = dead_letter(bus, collector_port)
    client = await bus.client()
    await wait_renderers(client, 1)
    assert (await client.call("toposm.queuemaster", {"command": "render", "tile": "5/3/4"}, timeout=60))[
        "command"
    ] == "rendered"
    first.stop()  # a restart: a new process id, the same --hostname and port
    second = bus.renderer("--metrics-port", str(renderer_port), "--hostname", HOST)

    async def the_new_renderer() -> bool:
        threads = (await client.call("toposm.queuemaster", {"command": "stats"}))["renderers"]
        return [t["renderer"].split(".")[3] for t in threads] == [str(second.pid)]

    await eventually(the_new_renderer, timeout=30)
    assert (await client.call("toposm.queuemaster", {"command": "render", "tile": "6/0/0"}, timeout=60))[
        "command"
    ] == "rendered"
    web = start_web(bus)

    def rendered_twice() -> str | None:
        text = scrape(qm_port)
        return text if value(text, 'toposm_queuemaster_renders_total{status="rendered"}') == 2 else None

    texts = {"toposm_queuemaster": await eventually(rendered_twice, context=bus.logs)}
    thread = f"toposm.render.{HOST}.*.0"
    texts["toposm_renderer"] = await _scraped(
        renderer_port, f'qbroker_handled_total{{endpoint="{thread}",kind="rpc",status="ok"}}', bus
    )
    texts["toposm_replicate"] = await _scraped(replicate_port, "toposm_replicate_failures_in_a_row", bus)
    texts["qbroker_dead_letter"] = await _scraped(collector_port, "qbroker_connections", bus)
    with urllib.request.urlopen(web.url + "/metrics", timeout=10) as response:  # noqa: S310 - our own server
        texts["toposm_web"] = response.read().decode()
    pids = [p.pid for p in (queuemaster, first, second, follower, collector, web.proc)]

    # One series per render thread whatever its process: the queuemaster's calls to it and the thread's own.
    calls = {
        s.labels["endpoint"]
        for s in _samples(texts["toposm_queuemaster"], "qbroker_calls")
        if s.labels["endpoint"].startswith("toposm.render.")
    }
    assert calls == {thread}, calls
    assert (
        value(texts["toposm_queuemaster"], f'qbroker_calls_total{{endpoint="{thread}",kind="call",status="ok"}}') >= 2
    )  # both renders
    for namespace, text in texts.items():
        assert says_its_version(text, namespace, toposm.__version__), (namespace, text)
        assert not created_series(text), namespace
        assert not labels_naming(text, *pids), namespace

    # Every name is the one docs/metrics.md lists for its program, and the library's are the library's there.
    for namespace, section in (
        ("toposm_queuemaster", "toposm-queuemaster"),
        ("toposm_renderer", "toposm-renderer"),
        ("toposm_replicate", "toposm-replicate"),
        ("toposm_web", "toposm-web"),
        ("qbroker_dead_letter", "qbroker-dead-letter"),
    ):
        assert own(texts[namespace]) == documented(section), namespace
        library = offered(texts[namespace]) - own(texts[namespace]) - {f"{namespace}_build_info"}
        assert library and library <= documented(LIBRARY), namespace
    assert not missing(("toposm_", "qbroker_"), *texts.values())  # what the Grafana dashboard asks of them


async def _scraped(port: int, sample: str, bus: TileBus) -> str:
    """The program's text once ``sample`` has counted something (the program is up and has done its part)."""

    def counted() -> str | None:
        try:
            text = scrape(port)
        except OSError:  # not serving yet
            return None
        return text if value(text, sample) >= 1 else None

    return str(await eventually(counted, context=bus.logs))


def _samples(text: str, family: str) -> list[Sample]:
    return [s for f in text_string_to_metric_families(text) if f.name == family for s in f.samples]
