"""The cc, fairness and aqm commands for real, each once in a short run (about 3 minutes in all): each
an experiment run by the experiment's driver, what they report, and that they leave no bridge, QoS
row or iperf3 behind, even when interrupted."""
import json
import signal
import subprocess
import time
from pathlib import Path

from tests.integration.conftest import leftovers as new_leftovers
from tests.integration.conftest import requires_ovs
from topo.harness import capabilities as cap
from topo.harness.report import jain_index
from topo.net import experimentfile
from topo.studies.aqm import DISCIPLINES
from topo.studies.experiment.planning import tc_kind

pytestmark = requires_ovs

REPO = Path(__file__).resolve().parents[2]
PYTHON = str(REPO / ".venv" / "bin" / "python")
SHORT = ["--quick", "--seconds", "4"]


def leftovers() -> dict[str, str]:
    """What a study may leave behind and was not there when the tests began: bridges, QoS/Queue rows,
    iperf3 processes, controllers."""
    return {what: text for what, text in new_leftovers().items() if text}


def assert_clean() -> None:
    deadline = time.monotonic() + 10     # a controller left running removes its rows as the bridges go
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(), leftovers()


def run_study(*args: str, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([PYTHON, "topo/run.py", *args, "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=240, check=False)
    assert_clean()
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads((out / "summary.json").read_text())


def test_cc_measures_every_algorithm_of_the_kernel(tmp_path):
    done, summary = run_study("cc", *SHORT, out=tmp_path)
    kernel = cap.tcp_algorithms()
    assert {"reno", "cubic", "bbr"} <= set(kernel), "this test expects a kernel with reno, cubic and bbr"
    for algorithm in ("reno", "cubic", "bbr"):
        row = summary["algorithms"][algorithm]
        assert row["throughput_mbps"] > 0.5 and row["rtt_mean_ms"] > 0, row
        assert row["congestion_control"] == algorithm and row["cwnd_max_packets"] >= row["cwnd_mean_packets"] > 0
        assert (tmp_path / "raw" / algorithm / f"h1-h4_{algorithm}.json").exists()
    lacking = [a for a in cap.STUDY_TCP if a not in kernel]
    assert sorted(summary["skipped"]) == sorted(lacking)
    assert done.stderr.count("skipped") == 1 if lacking else "skipped" not in done.stderr
    assert (tmp_path / "table.md").read_text().count("| reno |") == 2       # measured and published
    assert (tmp_path / "cc.png").stat().st_size > 0
    # The run was an experiment, and wrote its file: one trial per algorithm it asked for.
    written = experimentfile.load(tmp_path / "experiment.yaml")
    assert {t.name for t in written.trials} >= {"reno", "cubic", "bbr"} and list(summary["trials"]) == \
        list(summary["algorithms"])


def test_fairness_reports_each_case_and_its_index(tmp_path):
    _, summary = run_study("fairness", *SHORT, out=tmp_path)
    names = [c["name"] for c in summary["cases"]]
    assert names == ["cubic vs reno", "bbr vs cubic", "bbr vs reno", "cubic vs UDP"]
    for case in summary["cases"]:
        rates = [f["mbps"] for f in case["flows"]]
        assert len(rates) == 2 and all(r >= 0 for r in rates) and sum(rates) > 0.5, case
        assert 0.5 <= case["jain_index"] <= 1, case
        assert case["jain_index"] == round(jain_index(rates), 3)
    tcp_cases = [c for c in summary["cases"] if all(f["protocol"] == "tcp" for f in c["flows"])]
    # What the study shows (docs/other-studies.md): a UDP flood takes nearly all from TCP (about 0.5: for two
    # flows 0.5 is one flow getting everything, so "> 0.5" alone would pass nearly any outcome), while two
    # loss-based TCP flows share one FIFO far more fairly, though not always equally: cubic against reno
    # measured 0.848 in a short run on a fresh clone (1.38 vs 3.40 Mbit/s), and the published cubic pair 0.69.
    # BBR against a loss-based flow may take most of a queue this short (bbr 4.27, cubic 0.53 Mbit/s, J = 0.623,
    # in one of five 10 s runs: BBR kept the 25 packets full, cubic's window stayed at 2-3 packets), so its
    # pairs are held only to beating the flood.
    udp_case = summary["cases"][-1]
    assert udp_case["jain_index"] < 0.6, udp_case
    (loss_based,) = [c for c in tcp_cases if c["name"] == "cubic vs reno"]
    assert loss_based["jain_index"] >= udp_case["jain_index"] + 0.15, (loss_based, udp_case)
    assert all(c["jain_index"] > udp_case["jain_index"] for c in tcp_cases), (tcp_cases, udp_case)
    udp = summary["cases"][-1]["flows"][1]
    assert udp["protocol"] == "udp" and udp["offered_mbps"] == 10
    assert (tmp_path / "fairness.png").stat().st_size > 0


def test_aqm_runs_what_the_kernel_has_and_names_what_it_lacks(tmp_path):
    done, summary = run_study("aqm", *SHORT, out=tmp_path)
    lacking = {d for d in DISCIPLINES if not cap.qdisc_available(tc_kind(d, "user"))}
    assert set(summary["unavailable"]) == lacking
    assert set(summary["disciplines"]) == set(DISCIPLINES) - lacking
    fifo = summary["disciplines"]["fifo"]
    assert 0.5 < fifo["utilisation"] <= 1.05 and fifo["delay_ms"]["mean"] > 0, fifo
    assert fifo["backlog"]["samples"] >= 3 and fifo["leaf_kinds_seen"] == ["pfifo_head_drop"]
    assert fifo["congestion_control"] == ["cubic"] and len(fifo["flows_mbps"]) == 5
    if lacking:
        assert done.stderr.count("not run") == 1 and all(d in done.stderr for d in lacking)


def test_ctrl_c_leaves_nothing_behind(tmp_path):
    proc = subprocess.Popen([PYTHON, "topo/run.py", "cc", "--seconds", "30", "--algorithms", "cubic",
                             "--out", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "raw").glob("cubic")) or not _iperf3_running():   # traffic is flowing
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert_clean()


def _iperf3_running() -> bool:
    return subprocess.run(["pgrep", "-f", "iperf3 -c"], capture_output=True).returncode == 0
