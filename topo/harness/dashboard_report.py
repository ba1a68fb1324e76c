"""`topo/run.py report RESULTS_DIR`: the Grafana dashboards drawn from a run's own Prometheus data, without Grafana.

It writes RESULTS_DIR/report.html, one page that needs no network (every figure inline as a data: URI), and
RESULTS_DIR/report/<dashboard>-<nn>-<slug>.png, one figure per panel. Each panel's PromQL comes from
dashboards/*.json with Grafana's template variables filled in (the dashboards' own ones as "All"), and is asked of
Debian's prometheus serving a copy of RESULTS_DIR/prometheus on a spare loopback port, over the span that holds data.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import re
import signal
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import is_color_like  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from topo.harness.prometheus import PrometheusError, api, serving  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "dashboards"
ALL_VALUE = ".*"              # a dashboard's own variables are multi-value and used only inside =~ matchers
SCRAPE_SECONDS = 1            # prometheus/prometheus.yml's scrape_interval (a unit test holds them equal)
MAX_POINTS = 1000             # about what Grafana asks for per panel
MAX_SERIES = 8                # lines, numbers or bands per figure; the rest are counted, not drawn
NO_DATA = "no data in this run"
UNITS = {"Mbits": "Mbit/s", "pps": "packets/s", "percent": "%", "none": ""}

_VARIABLE_RE = re.compile(
    r"\$\{(?P<braced>\w+)(?::[^}]*)?\}"            # ${name} or ${name:format}
    r"|\[\[(?P<bracketed>\w+)(?::[^\]]*)?\]\]"     # [[name]] (deprecated syntax)
    r"|\$(?P<plain>\w+)"                           # $name
)
_LEGEND_RE = re.compile(r"\{\{\s*(.+?)\s*\}\}")


# ------------------------------------------------------------------ dashboards → panels


@dataclass(frozen=True)
class Panel:
    dashboard: str                        # file name without .json, e.g. "qos-controller"
    number: int                           # position in the dashboard, rows not counted, from 1
    row: str                              # title of the row it sits under ("" above the first row)
    title: str
    kind: str                             # timeseries, stat or state-timeline
    unit: str                             # Grafana's unit id, e.g. "Mbits"
    targets: tuple[tuple[str, str], ...]  # (PromQL with variables filled in, legendFormat)
    raw: dict                             # the panel's JSON, for its mappings, decimals, min, ...

    @property
    def filename(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")
        return f"{self.dashboard}-{self.number:02d}-{slug}.png"


def substitute_variables(expr: str, variables: Mapping[str, str]) -> str:
    """Grafana's template variables in `expr` replaced by `variables`; a built-in ($__*) that `variables` lacks
    raises KeyError (a typo cannot slip through), a dashboard's own variable that it lacks becomes ALL_VALUE."""
    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracketed") or match.group("plain")
        if name in variables:
            return variables[name]
        if name.startswith("__"):
            raise KeyError(f"unknown Grafana built-in variable ${name} in {expr!r}")
        return ALL_VALUE

    return _VARIABLE_RE.sub(replace, expr)


def builtin_variables(span: float, step: float) -> dict[str, str]:
    """Grafana's built-in variables for a panel that shows `span` seconds at one point every `step` seconds."""
    rate = max(step + SCRAPE_SECONDS, 4 * SCRAPE_SECONDS)     # Grafana's own rule for $__rate_interval
    whole = math.ceil(span)
    return {"__interval": f"{step:g}s", "__interval_ms": f"{step * 1000:.0f}", "__rate_interval": f"{rate:g}s",
            "__range": f"{whole}s", "__range_s": str(whole), "__range_ms": str(whole * 1000)}


def query_step(span: float) -> int:
    """Seconds between points: one per scrape, unless that would pass MAX_POINTS."""
    return max(SCRAPE_SECONDS, math.ceil(span / MAX_POINTS))


def dashboard_paths(directory: Path = DASHBOARD_DIR) -> list[Path]:
    """The dashboard JSON files (what Grafana's file provider loads)."""
    return sorted(directory.glob("*.json"))


def load_dashboard(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())


def iter_panels(panels: Iterable[dict]) -> Iterator[dict]:
    """All panels, including those nested in (collapsed) rows, each after its row."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def read_dashboard(path: Path | str, variables: Mapping[str, str]) -> tuple[str, list[Panel]]:
    """The dashboard's title and its panels (rows are only section titles); hidden targets are left out,
    as Grafana leaves them out."""
    path = Path(path)
    dashboard = load_dashboard(path)
    panels: list[Panel] = []
    row = ""
    for raw in iter_panels(dashboard.get("panels", [])):
        if raw["type"] == "row":
            row = raw.get("title", "")
            continue
        targets = tuple((substitute_variables(t["expr"], variables), t.get("legendFormat", ""))
                        for t in raw.get("targets", []) if t.get("expr") and not t.get("hide"))
        unit = raw.get("fieldConfig", {}).get("defaults", {}).get("unit", "none")
        panels.append(Panel(path.stem, len(panels) + 1, row, raw.get("title", ""), raw["type"], unit, targets, raw))
    return dashboard.get("title", path.stem), panels


# ------------------------------------------------------------------ names, units, values


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """A series' name: the legendFormat with {{label}} filled in (a label the series lacks gives ""), or,
    without one, its label set as Prometheus writes it."""
    if fmt and fmt != "__auto":
        return _LEGEND_RE.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{labels.get('__name__', '')}{{{rest}}}"


def unit_name(unit: str | None) -> str:
    """Grafana's unit id in words; "" for none."""
    return UNITS.get(unit or "none", unit or "")


def mapped(panel: Panel, value: float) -> tuple[str, str] | None:
    """(text, colour) of the panel's value mapping for `value`, if it has one."""
    for mapping in panel.raw.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        hit = mapping.get("options", {}).get(f"{value:g}") if mapping.get("type") == "value" else None
        if hit:
            return hit.get("text", f"{value:g}"), hit.get("color", "")
    return None


def format_value(panel: Panel, value: float) -> str:
    """What a stat shows: the mapped text, else the number in the panel's unit."""
    text = mapped(panel, value)
    if text:
        return text[0]
    decimals = panel.raw.get("fieldConfig", {}).get("defaults", {}).get("decimals")
    if decimals is None:     # as Grafana: whole numbers as they are, others to three significant digits
        decimals = 0 if value == round(value) else max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f} {unit_name(panel.unit)}".strip()


@dataclass(frozen=True)
class Series:
    name: str
    times: np.ndarray    # seconds since the start of the run's data
    values: np.ndarray


def top_series(series: list[Series], limit: int = MAX_SERIES) -> tuple[list[Series], int]:
    """The `limit` series with the highest peaks, and how many were left out."""
    ranked = sorted(series, key=lambda s: -s.values.max())
    return ranked[:limit], max(0, len(series) - limit)


def to_series(result: list[dict], fmt: str, start: float) -> list[Series]:
    """Prometheus' query_range result as named series, without the points that are not numbers."""
    out = []
    for item in result:
        points = np.array([(float(t), float(v)) for t, v in item["values"]], dtype=float).reshape(-1, 2)
        points = points[np.isfinite(points[:, 1])]
        if len(points):
            out.append(Series(legend(fmt, item["metric"]), points[:, 0] - start, points[:, 1]))
    return sorted(out, key=lambda s: s.name)


# ------------------------------------------------------------------ figures


def render(panel: Panel, series: list[Series], step: float, span: float) -> bytes:
    """The panel as a PNG: a line per series, a number per series (stat), or bands of values (state-timeline),
    the time axes from 0 to `span` so that panels line up."""
    width = max(4.0, 14 * panel.raw.get("gridPos", {}).get("w", 12) / 24)   # as wide as Grafana's grid has it
    shown, hidden = top_series(series)
    if not shown:
        fig, ax = plt.subplots(figsize=(width, 2.0))
        ax.axis("off")
        ax.text(0.5, 0.5, NO_DATA, ha="center", va="center", fontsize=12, color="grey")
    elif panel.kind == "stat":
        fig, ax = _stat(panel, shown, width)
    elif panel.kind == "state-timeline":
        fig, ax = _state_timeline(panel, shown, step, width)
        ax.set_xlim(0, span)
    else:
        fig, ax = _timeseries(panel, shown, step, width)
        ax.set_xlim(0, span)
    if hidden:
        ax.annotate(f"+{hidden} more series (lower peaks) not drawn", (1, 1), xycoords="axes fraction",
                    ha="right", va="bottom", fontsize=7, color="grey")
    ax.set_title(panel.title, fontsize=10, loc="left", pad=14 if hidden else 6)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _timeseries(panel: Panel, series: list[Series], step: float, width: float):
    fig, ax = plt.subplots(figsize=(width, 3.6))
    steps = panel.raw["fieldConfig"]["defaults"].get("custom", {}).get("lineInterpolation") == "stepAfter"
    for s in series:
        # A NaN where points are missing breaks the line where the series stopped (Grafana's spanNulls: false).
        gaps = np.flatnonzero(np.diff(s.times) > 1.5 * step) + 1
        ax.plot(np.insert(s.times, gaps, s.times[gaps - 1] + step), np.insert(s.values, gaps, np.nan),
                label=s.name, linewidth=1, drawstyle="steps-post" if steps else "default")
    low = panel.raw["fieldConfig"]["defaults"].get("min")
    if low is not None:
        ax.set_ylim(bottom=low)
    ax.set_ylabel(unit_name(panel.unit) or panel.raw["fieldConfig"]["defaults"].get("custom", {}).get("axisLabel", ""))
    ax.set_xlabel("seconds since the start of the run's data")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.18), frameon=False,
              ncol=2 if len(series) > 4 and width >= 6 else 1)
    return fig, ax


def _stat(panel: Panel, series: list[Series], width: float):
    columns = min(len(series), max(1, int(width // 1.6)))
    rows = math.ceil(len(series) / columns)
    fig, ax = plt.subplots(figsize=(width, 0.5 + 1.1 * rows), gridspec_kw={"left": 0.02, "right": 0.98})
    ax.axis("off")
    by_name = panel.raw.get("options", {}).get("textMode") == "name"    # e.g. the policy in force
    texts = [s.name if by_name else format_value(panel, s.values[-1]) for s in series]
    # Bold characters are about 0.65 em wide: the longest text fits its column.
    size = min(20, 72 * 0.9 * width / columns / (0.65 * max(map(len, texts))))
    for i, (s, text) in enumerate(zip(series, texts)):
        x, y = (i % columns + 0.5) / columns, 1 - (i // columns + 0.45) / rows
        colour = (mapped(panel, s.values[-1]) or ("", ""))[1]
        ax.text(x, y, text, ha="center", va="center", fontsize=size, weight="bold",
                color=colour if is_color_like(colour) else "black")
        if not by_name:
            ax.text(x, y - 0.32 / rows, s.name, ha="center", va="center", fontsize=8, color="dimgrey")
    ax.annotate("the last value of each series in the run", (0, 0), xycoords="axes fraction", va="top",
                fontsize=7, color="grey")
    return fig, ax


def _state_timeline(panel: Panel, series: list[Series], step: float, width: float):
    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.35 * len(series)))
    legend_entries = {}
    for row, s in enumerate(reversed(series)):
        # Each sample holds until the next one, or for one step where the series stops.
        ends = np.append(np.where(np.diff(s.times) <= 1.5 * step, s.times[1:], s.times[:-1] + step),
                         s.times[-1] + step)
        for value in np.unique(s.values):
            text, colour = mapped(panel, value) or (f"{value:g}", "")
            colour = "none" if colour == "transparent" else colour if is_color_like(colour) else \
                "lightgrey" if value == 0 else "tab:blue"
            at = s.values == value
            ax.broken_barh(list(zip(s.times[at], ends[at] - s.times[at])), (row - 0.4, 0.8), facecolors=colour,
                           linewidth=0)
            legend_entries[text] = Patch(facecolor=colour, edgecolor="grey", label=text)
    ax.set_yticks(range(len(series)), [s.name for s in reversed(series)], fontsize=8)
    ax.set_ylim(-0.6, len(series) - 0.4)
    ax.set_xlabel("seconds since the start of the run's data")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=list(legend_entries.values()), fontsize=7, loc="lower right", bbox_to_anchor=(1, 1),
              ncol=len(legend_entries), frameon=False)
    return fig, ax


# ------------------------------------------------------------------ the page


@dataclass(frozen=True)
class Figure:
    panel: Panel
    png: bytes
    has_data: bool


_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222;background:#fafafa}
.grid{display:grid;grid-template-columns:repeat(24,1fr);gap:12px}
figure{margin:0;padding:8px;background:#fff;border:1px solid #ddd;border-radius:4px}
figure img{width:100%;height:auto}
figcaption{font-size:.85em;color:#555}
.nodata{color:#a00;font-weight:bold}
@media (max-width:1000px){figure{grid-column:span 24!important}}"""


def html_page(title: str, intro: list[str], dashboards: list[tuple[str, list[Figure]]]) -> str:
    """One self-contained page: the figures are data: URIs, the style is inline, nothing is fetched."""
    esc = html.escape
    parts = [f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{esc(title)}</h1>"]
    parts += [f"<p>{esc(line)}</p>" for line in intro]
    for dashboard, figures in dashboards:
        parts.append(f"<h2>{esc(dashboard)}</h2>")
        for row, in_row in groupby(figures, key=lambda f: f.panel.row):
            parts.append((f"<h3>{esc(row)}</h3>" if row else "") + "<div class=\"grid\">")
            parts += [_figure_html(fig) for fig in in_row]
            parts.append("</div>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _figure_html(fig: Figure) -> str:
    esc = html.escape
    span = fig.panel.raw.get("gridPos", {}).get("w", 12)
    png = base64.b64encode(fig.png).decode()
    return (f"<figure id=\"{esc(fig.panel.filename[:-4])}\" style=\"grid-column:span {span}\">"
            f"<figcaption><b>{esc(fig.panel.title)}</b> {esc(fig.panel.raw.get('description', ''))}</figcaption>"
            + ("" if fig.has_data else f"<p class=\"nodata\">{NO_DATA}</p>")
            + f"<img alt=\"{esc(fig.panel.title)}\" src=\"data:image/png;base64,{png}\"></figure>")


# ------------------------------------------------------------------ Prometheus on the run's data


def data_span(url: str, tsdb: Path) -> tuple[float, float] | None:
    """First and last sample times (s) in the run's data: the head's, as Prometheus reports them, and those of
    the blocks it has persisted (meta.json); None when it holds no sample."""
    head = api(url, "/api/v1/status/tsdb")["headStats"]
    spans = [(head["minTime"], head["maxTime"])]
    metas = [json.loads(path.read_text()) for path in tsdb.glob("*/meta.json")]
    spans += [(meta["minTime"], meta["maxTime"]) for meta in metas]
    spans = [(lo, hi) for lo, hi in spans if lo <= hi]     # an empty head reports min > max
    if not spans:
        return None
    return min(lo for lo, _ in spans) / 1000, max(hi for _, hi in spans) / 1000


def write_report(results: Path) -> Path:
    tsdb = results / "prometheus"
    with serving(tsdb) as url:
        span = data_span(url, tsdb)
        if span is None:
            raise PrometheusError(f"{tsdb} holds no samples")
        start, end = span
        step = query_step(end - start)
        variables = builtin_variables(end - start, step)
        out = results / "report"
        out.mkdir(exist_ok=True)
        for old in out.glob("*.png"):      # a panel renamed since the last report must not linger
            old.unlink()
        dashboards = []
        for path in dashboard_paths():
            title, panels = read_dashboard(path, variables)
            figures = []
            for panel in panels:
                series = [s for expr, fmt in panel.targets
                          for s in to_series(api(url, "/api/v1/query_range", query=expr, start=start, end=end,
                                                  step=step)["result"], fmt, start)]
                figure = Figure(panel, render(panel, series, step, end - start), bool(series))
                (out / panel.filename).write_bytes(figure.png)
                figures.append(figure)
            dashboards.append((title, figures))
    began = datetime.fromtimestamp(start).astimezone()
    intro = [(f"Results: {results.resolve()}. Data from {began:%Y-%m-%d %H:%M:%S %Z} for {end - start:.0f} s "
              f"(time 0 on every axis), one point every {step} s."),
             (f"Every panel of dashboards/*.json, asked of the run's own Prometheus data with every dashboard "
              f"variable (policy, datapath, port) set to All, $__rate_interval = {variables['__rate_interval']} "
              f"and $__range = {variables['__range']}. At most {MAX_SERIES} series are drawn per panel, those with "
              "the highest peaks.")]
    page = results / "report.html"
    page.write_text(html_page(f"QoS study report: {results.resolve().name}", intro, dashboards))
    return page


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="topo/run.py report", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, metavar="RESULTS_DIR", help="a study's results folder")
    results = parser.parse_args(argv).results
    if not results.is_dir():
        print(f"error: {results} is not a folder", file=sys.stderr)
        return 2
    if not (results / "prometheus").is_dir():
        print(f"error: {results} has no prometheus/ folder: the run kept no data of its own (--prometheus none, "
              "or a Prometheus already on 127.0.0.1:9090 recorded it)", file=sys.stderr)
        return 2
    # Ctrl-C and SIGTERM both unwind through serving()'s `finally`, which stops prometheus and removes the copy.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        print(write_report(results))
    except (PrometheusError, OSError) as err:     # OSError: the copy, or prometheus gone mid-query
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
