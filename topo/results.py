"""Results of a study run: summary.json, a Markdown table and a figure."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def table(summary: dict[str, Any]) -> str:
    """TCP throughput (and UDP delivered) per offered UDP rate, one column pair per policy."""
    policies = summary["policies"]
    names = list(policies)
    head = "| UDP offered (Mbit/s) | " + " | ".join(f"{n}: TCP | {n}: UDP delivered" for n in names) + " |"
    rule = "|---:|" + "---:|---:|" * len(names)
    lines = [head, rule]
    rates = [s["udp_mbps_offered"] for s in policies[names[0]]["steps"]]
    for i, rate in enumerate(rates):
        cells = []
        for n in names:
            step = policies[n]["steps"][i]
            cells += [_fmt(step["tcp_mbps"]), _fmt(step["udp_mbps_delivered"])]
        lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure(summary: dict[str, Any], path: Path) -> None:
    """The study's Figure 2: TCP throughput against offered UDP rate, one line per policy."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, result in summary["policies"].items():
        steps = result["steps"]
        ax.plot([s["udp_mbps_offered"] for s in steps], [s["tcp_mbps"] or 0 for s in steps],
                marker="o", label=f"{name}")
    ax.axhline(summary["bottleneck_mbps"], color="grey", linestyle=":", label="bottleneck")
    reservations = {r.get("tcp_reservation_mbps") for r in summary["policies"].values()} - {None}
    for mbps in reservations:
        ax.axhline(mbps, color="grey", linestyle="--", label=f"TCP reservation ({mbps:g} Mbit/s)")
    ax.set_xlabel("offered UDP rate (Mbit/s)")
    ax.set_ylabel("TCP throughput (Mbit/s)")
    ax.set_ylim(bottom=0, top=summary["bottleneck_mbps"] * 1.15)
    ax.set_title(f"TCP under a UDP flood, {summary['bottleneck_mbps']:g} Mbit/s bottleneck")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"
