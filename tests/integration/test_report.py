"""`topo/run.py report` on the quick main study's results (conftest's quick_study): every panel of every
dashboard on one self-contained page, drawn from the run's own Prometheus data, which it leaves as it was."""
import html
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import requires_ovs
from topo.harness.dashboard_report import NO_DATA, builtin_variables, dashboard_paths, read_dashboard

REPO = Path(__file__).resolve().parents[2]
pytestmark = requires_ovs


def _files(folder: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in folder.rglob("*")}


@pytest.fixture(scope="module")
def report(quick_study):
    out, *_ = quick_study
    tsdb_before = _files(out / "prometheus")
    copies_before = set(Path(tempfile.gettempdir()).glob("ovsqos-report-*"))
    done = subprocess.run([sys.executable, "topo/run.py", "report", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(out / "report.html")
    return out, (out / "report.html").read_text(), tsdb_before, copies_before


def figures(page: str) -> dict[str, str]:
    """figure id (the PNG's name without .png) → the figure's HTML."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<figure id="([^"]+)".*?</figure>', page, re.S)}


def panels():
    # Only the names and titles are wanted here; any durations fill the variables.
    return [p for path in dashboard_paths() for p in read_dashboard(path, builtin_variables(60, 1))[1]]


def test_every_panel_of_every_dashboard_is_on_the_page_and_in_a_png(report):
    out, page, *_ = report
    on_page = figures(page)
    for panel in panels():
        figure = on_page[panel.filename[:-4]]
        assert f"<b>{html.escape(panel.title)}</b>" in figure, panel.title
        assert (out / "report" / panel.filename).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", panel.filename
    assert len(on_page) == len(panels())


def test_every_panel_has_data(report):
    _, page, *_ = report
    on_page = figures(page)
    empty = [f"{p.dashboard} / {p.title}" for p in panels() if NO_DATA in on_page[p.filename[:-4]]]
    assert not empty, empty


def test_the_page_fetches_nothing(report):
    _, page, *_ = report
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page, re.I)
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', page))


def test_the_runs_data_is_untouched_and_nothing_is_left_running_or_copied(report):
    out, _, tsdb_before, copies_before = report
    assert _files(out / "prometheus") == tsdb_before
    assert set(Path(tempfile.gettempdir()).glob("ovsqos-report-*")) == copies_before
    running = subprocess.run(["pgrep", "-af", "ovsqos-report-"], capture_output=True, text=True).stdout
    assert running == "", running
