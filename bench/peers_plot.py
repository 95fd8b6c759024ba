"""The plot of bench/peers.py: calls/s and p99 latency against calls in flight, per contender.

.venv/bin/python bench/peers_plot.py RESULT.json [OUT.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

STYLE = {"same": "-", "two": "--"}
LABEL = {"same": "one process", "two": "two processes"}
COLORS = {
    "qbroker": "tab:red",
    "aio_pika_rpc": "tab:blue",
    "faststream": "tab:green",
    "floor_seed": "tab:gray",
    "floor_seed_queued": "tab:brown",
    "floor_direct": "black",
    "qbroker_wire_aiormq": "tab:orange",
}


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, (left, right, ratios) = plt.subplots(1, 3, figsize=(17, 4.8))
    for variant, summary in result["variants"].items():
        levels = sorted(summary["rpc"], key=int)
        order = list(COLORS)
        names = sorted(
            {name for level in levels for name in summary["rpc"][level]},
            key=lambda n: order.index(n) if n in order else len(order),
        )
        for name in names:
            xs = [int(level) for level in levels if name in summary["rpc"][level]]
            rows = [summary["rpc"][str(x)][name] for x in xs]
            kw = {
                "linestyle": STYLE.get(variant, ":"),
                "color": COLORS.get(name),
                "marker": "o",
                "label": f"{name} ({LABEL.get(variant, variant)})",
            }
            left.plot(xs, [r["calls_per_s"]["median"] for r in rows], **kw)
            right.plot(xs, [r["p99_ms"]["median"] for r in rows], **kw)
            if name == "qbroker":
                continue
            # The steadier figure on a shared machine: qbroker over the peer within each round.
            xs = [int(level) for level in levels if f"qbroker/{name}" in summary["ratios"].get(level, {})]
            ratios.plot(
                xs,
                [summary["ratios"][str(x)][f"qbroker/{name}"]["throughput"]["median"] for x in xs],
                **{**kw, "label": f"qbroker / {name} ({LABEL.get(variant, variant)})"},
            )
    m = result["machine"]
    for ax, title in (
        (left, "throughput (calls/s, median of rounds)"),
        (right, "p99 latency (ms, median of rounds)"),
        (ratios, "qbroker / peer, calls/s (median of per-round ratios)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("calls in flight")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    right.set_yscale("log")
    ratios.axhline(1.0, color="black", linewidth=0.8)
    left.legend(fontsize=7)
    ratios.legend(fontsize=6)
    fig.suptitle(
        f"echo RPC, all contenders interleaved in one run: {m['nproc']} x {m['cpu']}, "
        f"RabbitMQ {m['rabbitmq']}, Python {m['python']}, {result['loop']}",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    source = Path(sys.argv[1])
    plot(json.loads(source.read_text()), Path(sys.argv[2]) if len(sys.argv) > 2 else source.with_suffix(".png"))
