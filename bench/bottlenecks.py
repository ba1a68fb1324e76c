"""How fast `auto` answers each bottleneck of a parking lot, on its own:

    sudo .venv/bin/python -m bench.bottlenecks --runs 5

Runs the launcher on topo/topos.py's parkinglot (s1 - s2 - s3, 5 and 4 Mbit/s) under `auto`, `--runs`
times, with a TCP flow across both bottlenecks, a 12 Mbit/s flood over the second (s2 port 2) from the
second step and one over the first (s1 port 1) from the third. For each bottleneck it prints the delay
from its flood's start (when the flood's iperf3 server took its data) to the controller's decision to
program that port, and any decision elsewhere or before its flood (a false one). Prints numbers only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAFFIC = """
step_seconds: 8
steps: 3
flows:
  - {name: bulk, from: h1, to: h5, protocol: tcp, cc: cubic}
  - {name: second, from: h3, to: h6, protocol: udp, rate: 12Mbit, start_step: 1}
  - {name: first, from: h2, to: h4, protocol: udp, rate: 12Mbit, start_step: 2}
"""
# bottleneck → (its switch and port, the flood over it and the step it starts in)
BOTTLENECKS = {"s1-s2 (5 Mbit/s)": (("0000000000000001", 1), "first", 2),
               "s2-s3 (4 Mbit/s)": (("0000000000000002", 2), "second", 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    delays: dict[str, list[float]] = {name: [] for name in BOTTLENECKS}
    false = 0
    with tempfile.TemporaryDirectory() as tmp:
        traffic = Path(tmp) / "traffic.yaml"
        traffic.write_text(TRAFFIC)
        for run in range(args.runs):
            out = Path(tmp) / f"run{run}"
            done = subprocess.run([sys.executable, "topo/run.py", "--topo", "topo/topos.py:parkinglot", "--topo-param",
                                   "last_bw=4", "--traffic", str(traffic), "--policy", "auto", "--out", str(out)],
                                  cwd=REPO, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                print(f"run {run + 1} failed: {done.stderr.strip()[-500:]}", file=sys.stderr)
                return 1
            summary = json.loads((out / "summary.json").read_text())["trials"]["auto"]
            found, wrong = reactions(summary)
            false += wrong
            for name, delay in found.items():
                delays[name].append(delay)
            print(f"run {run + 1}: " + ", ".join(f"{n} {d:.3f} s" for n, d in found.items()), flush=True)
    for name, values in delays.items():
        if values:
            print(f"{name:18} decided after its flood: median {statistics.median(values):.3f} s, "
                  f"max {max(values):.3f} s, over {len(values)} runs")
        else:
            print(f"{name:18} never decided")
    print(f"false programs     {false} (elsewhere, or before the flood)")
    return 0


def reactions(summary: dict) -> tuple[dict[str, float], int]:
    """Each bottleneck's delay from its flood's start to the first program of its port; and how many
    programs were false (another port, or before the flood)."""
    found: dict[str, float] = {}
    wrong = 0
    for decision in summary["decisions"]:
        if decision["action"] != "program":
            continue
        where = (decision["dp_id"], decision["port"])
        match = next(((name, flood, step) for name, (port, flood, step) in BOTTLENECKS.items() if port == where), None)
        if match is None:
            wrong += 1
            continue
        name, flood, step = match
        onset = summary["steps"][step]["flows"][flood].get("started_s")
        if onset is None or decision["at_s"] < onset:
            wrong += 1
        elif name not in found:
            found[name] = round(decision["at_s"] - onset, 3)
    return found, wrong


if __name__ == "__main__":
    sys.exit(main())
