"""Writing results: summary.json, Markdown tables, bar charts, and the plain words for what a host lacks."""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@dataclass(frozen=True)
class Panel:
    """One bar chart: a bar per group for each series."""
    ylabel: str
    series: dict[str, list[float | None]]
    line: tuple[float, str] | None = None         # (y, label) of a reference line
    annotations: list[str] = field(default_factory=list)   # one text above each group


def write_json(path: Path, data: Any) -> None:
    """Written whole or not at all: a reader never sees half a summary, even after a kill."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def jain_index(xs: Iterable[float]) -> float:
    """Jain's fairness index J = (Σx)² / (n·Σx²): 1 when every flow got the same, 1/n when one got all."""
    xs = list(xs)
    if not xs:
        raise ValueError("Jain's index of no flows is undefined")
    if any(x < 0 for x in xs):
        raise ValueError(f"throughputs cannot be negative: {xs}")
    squares = sum(x * x for x in xs)
    if squares == 0:
        raise ValueError("Jain's index is undefined when every flow got nothing")
    return sum(xs) ** 2 / (len(xs) * squares)


def reasons_text(reasons: dict[str, str]) -> str:
    """"a, b (why)": names that share a reason (but for their own name) share it."""
    return "; ".join(f"{', '.join(names)} ({why})" for why, names in group_reasons(reasons).items())


def group_reasons(reasons: dict[str, str]) -> dict[str, list[str]]:
    """reason, with each name written as <name> → the names that have it."""
    groups: dict[str, list[str]] = {}
    for name, why in reasons.items():
        groups.setdefault(why.replace(name, "<name>"), []).append(name)
    return groups


def markdown_table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def bar_figure(path: Path, title: str, groups: list[str], panels: list[Panel]) -> None:
    fig, axes = plt.subplots(1, len(panels), figsize=(1.2 + 3.6 * len(panels), 4.2), dpi=120,
                                     squeeze=False)
    for ax, panel in zip(axes[0], panels):
        width = 0.8 / len(panel.series)
        for k, (name, values) in enumerate(panel.series.items()):
            xs = [i + (k - (len(panel.series) - 1) / 2) * width for i in range(len(groups))]
            bars = ax.bar(xs, [v or 0.0 for v in values], width, label=name)
            ax.bar_label(bars, labels=[cell(v) for v in values], fontsize=7)
        for i, text in enumerate(panel.annotations):
            ax.annotate(text, (i, 1.0), xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=8)
        if panel.line:
            ax.axhline(panel.line[0], color="grey", linestyle=":", label=panel.line[1])
        crowded = len(groups) > 3 and not any("\n" in g for g in groups)   # two-line labels fit unrotated
        ax.set_xticks(range(len(groups)), groups, rotation=20 if crowded else 0, fontsize=7 if len(groups) > 3 else 8)
        ax.set_ylabel(panel.ylabel)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
        if len(panel.series) > 1 or panel.line:
            ax.legend(fontsize=7, loc="best", framealpha=0.9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
