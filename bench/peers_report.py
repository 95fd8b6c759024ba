"""Summaries of bench/peers.py samples: medians, per-round ratios to each peer, and the ratio goals."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
from typing import Any

# (peer, the ratio qbroker/peer asked for: docs/performance.md, "which goals are met")
RPC_GOALS = {
    "aio_pika_rpc": 1.0,
    "faststream": 2.0,
    "floor_seed": 0.85,
    "floor_seed_queued": None,
    "floor_direct": None,
    "qbroker_wire_aiormq": None,
}
ALERT_GOAL = ("floor_oneway", 0.8)
HEADLINE_LEVELS = ("1", "64")


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def _ratios(mine: list[float], theirs: list[float]) -> dict[str, float]:
    # Round by round: both figures were measured within seconds of each other on the same machine.
    return _spread([a / b for a, b in zip(mine, theirs, strict=True) if b > 0])


def summarize(samples: dict[str, Any]) -> dict[str, Any]:
    rpc: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for level, by_name in samples["rpc"].items():
        rpc[level] = {
            name: {
                "calls_per_s": _spread([r["calls_per_s"] for r in runs], 1),
                "p50_ms": _spread([r["p50_ms"] for r in runs], 2),
                "p99_ms": _spread([r["p99_ms"] for r in runs], 2),
            }
            for name, runs in by_name.items()
            if runs
        }
        mine = by_name.get("qbroker") or []
        if not mine:
            continue
        ratios[level] = {}
        for peer, runs in by_name.items():
            if peer == "qbroker" or not runs:
                continue
            ratios[level][f"qbroker/{peer}"] = {
                "throughput": _ratios([r["calls_per_s"] for r in mine], [r["calls_per_s"] for r in runs]),
                # below 1.0 is better here: qbroker's p99 latency over the peer's
                "p99_latency": _ratios([r["p99_ms"] for r in mine], [r["p99_ms"] for r in runs]),
            }
    alerts = {
        name: {
            "delivered_per_s": _spread([r["delivered_per_s"] for r in runs], 1),
            "published_per_s": _spread([r["published_per_s"] for r in runs], 1),
        }
        for name, runs in samples["alerts"].items()
        if runs
    }
    alert_ratio: dict[str, Any] = {}
    mine_alerts = samples["alerts"].get("qbroker")
    for peer, runs in samples["alerts"].items():
        if peer != "qbroker" and mine_alerts and runs:
            alert_ratio[f"qbroker/{peer}"] = _ratios(
                [r["delivered_per_s"] for r in mine_alerts], [r["delivered_per_s"] for r in runs]
            )
    return {"rpc": rpc, "ratios": ratios, "alerts": alerts, "alert_ratio": alert_ratio}


def goals(variants: dict[str, Any]) -> list[dict[str, Any]]:
    """Each of the ratio goals, per variant and level, judged on the median of the rounds."""
    out: list[dict[str, Any]] = []
    for variant, summary in variants.items():
        for level in HEADLINE_LEVELS:
            for peer, target in RPC_GOALS.items():
                ratio = summary["ratios"].get(level, {}).get(f"qbroker/{peer}")
                if ratio is None:
                    continue
                measured = ratio["throughput"]["median"]
                out.append(
                    {
                        "variant": variant,
                        "in_flight": int(level),
                        "goal": f"qbroker/{peer} calls/s",
                        "target": target,
                        "measured": measured,
                        "met": None if target is None else measured >= target,
                    }
                )
        alert = summary["alert_ratio"].get(f"qbroker/{ALERT_GOAL[0]}")
        if alert is not None:
            out.append(
                {
                    "variant": variant,
                    "goal": f"qbroker/{ALERT_GOAL[0]} alerts delivered/s",
                    "target": ALERT_GOAL[1],
                    "measured": alert["median"],
                    "met": alert["median"] >= ALERT_GOAL[1],
                }
            )
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _rabbitmq_version() -> str | None:
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "rabbitmq": _rabbitmq_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def markdown(result: dict[str, Any]) -> str:
    """The tables of docs/performance.md from one bench/peers.py result."""
    lines: list[str] = []
    for variant, summary in result["variants"].items():
        title = {
            "same": "one process (servers and clients on one event loop)",
            "two": "two processes (servers and listeners in another process)",
        }.get(variant, variant)
        lines += [
            f"**{title}**",
            "",
            "| calls in flight | contender | calls/s (median, range) | p99 ms | qbroker / it, calls/s "
            "(median, range) | qbroker / it, p99 |",
            "| ---: | --- | --- | ---: | --- | ---: |",
        ]
        for level in sorted(summary["rpc"], key=int):
            for name, row in summary["rpc"][level].items():
                tp = row["calls_per_s"]
                ratio = summary["ratios"].get(level, {}).get(f"qbroker/{name}")
                r_tp = (
                    (
                        f"{ratio['throughput']['median']:.2f} ({ratio['throughput']['min']:.2f}-"
                        f"{ratio['throughput']['max']:.2f})"
                    )
                    if ratio
                    else "-"
                )
                r_p99 = f"{ratio['p99_latency']['median']:.2f}" if ratio else "-"
                lines.append(
                    f"| {level} | {name} | {tp['median']:.0f} ({tp['min']:.0f}-{tp['max']:.0f}) | "
                    f"{row['p99_ms']['median']:.1f} | {r_tp} | {r_p99} |"
                )
        alerts = summary["alerts"]
        lines += ["", "| one-way | delivered/s (median, range) |", "| --- | --- |"]
        for name, row in alerts.items():
            d = row["delivered_per_s"]
            lines.append(f"| {name} | {d['median']:.0f} ({d['min']:.0f}-{d['max']:.0f}) |")
        for pair, ratio in summary["alert_ratio"].items():
            if ratio:
                lines.append(
                    f"| {pair.replace('/', ' / ')} | {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) |"
                )
        lines.append("")
    lines += [
        "| goal | variant | in flight | target | measured (median of rounds) | met |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for goal in result["goals"]:
        met = {True: "yes", False: "**no**", None: "(reported)"}[goal["met"]]
        lines.append(
            f"| {goal['goal']} | {goal['variant']} | {goal.get('in_flight', '-')} | "
            f"{goal['target'] if goal['target'] is not None else '-'} | {goal['measured']:.2f} | {met} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import json
    import sys

    with open(sys.argv[1]) as f:
        print(markdown(json.load(f)))
