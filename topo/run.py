"""The study launcher:  sudo python3 topo/run.py [STUDY] [options]

  topo/run.py --policy none reserve auto     the main study (topo/studies/main)
  topo/run.py cc | fairness | aqm ...        the other studies (docs/other-studies.md)
  topo/run.py --topo FILE:NAME --traffic FILE [--policy ...]
                                             your own network and traffic (docs/experiments.md)
  topo/run.py --experiment FILE              the same, with its trials, from an experiment file
  topo/run.py doctor                         what this host can emulate
  topo/run.py clean                          remove what a killed run left behind
  topo/run.py report RESULTS_DIR             the dashboards drawn from a run's own Prometheus data, for a host
                                             without Grafana: RESULTS_DIR/report.html (self-contained) and
                                             RESULTS_DIR/report/*.png, one per panel; needs no root
  topo/run.py vm -- <arguments>              run the launcher in a VM with a full kernel (vm/)
  topo/run.py COMMAND --help                 that command's or study's own flags

Each study runs its trials on fresh Mininet networks under the QoS controller (one already on
127.0.0.1:6653, or one it starts and stops), and writes raw iperf3 JSON, summary.json, a table and
a figure to --out (default results/<timestamp>[-<study>]/). cc, fairness and aqm are experiments
(topo/studies/experiment/) with tables of their own, and write their experiment file there too.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def _as_module() -> NoReturn:
    """This file run as a script (`sudo python3 topo/run.py`, whatever `python3` root has on PATH): run again,
    in the same process, as the module topo.run under the project's venv, with this checkout on its path
    (PYTHONPATH, which the controller the launcher starts inherits too) and no other (-P: not the working
    directory, where another checkout's `topo` may be)."""
    if not VENV_PYTHON.exists():
        sys.exit(f"error: {REPO / '.venv'} is missing; run scripts/setup.sh first (as root)")
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.execve(VENV_PYTHON, [str(VENV_PYTHON), "-P", "-m", "topo.run", *sys.argv[1:]],
              {**os.environ, "PYTHONPATH": path})


def entry(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command in ("-h", "--help"):
        print(_help())
        return 0
    if command == "doctor":
        from topo.harness import capabilities
        return capabilities.main(argv[1:])
    if command == "clean":
        from topo.harness.launch import clean
        return clean()
    if command == "report":
        from topo.harness import dashboard_report
        return dashboard_report.main(argv[1:])
    if command == "vm":
        from vm import harness
        return harness.main(argv[1:])
    from topo.studies import STUDIES
    from topo.studies.base import run
    if command in STUDIES:
        return run(STUDIES[command], argv[1:], f"topo/run.py {command}")
    if any(a.split("=")[0] in ("--topo", "--experiment") for a in argv):   # your own network: docs/experiments.md
        return run(STUDIES["experiment"], argv, "topo/run.py")
    return run(STUDIES["main"], argv, "topo/run.py")


def _help() -> str:
    """Every command, then the flags of the two studies the launcher runs without one: the main study's and
    your own experiment's."""
    from topo.studies import STUDIES
    from topo.studies.base import parser_for
    main = parser_for(STUDIES["main"], "topo/run.py").format_help()
    own = parser_for(STUDIES["experiment"], "topo/run.py").format_help()
    return "\n".join([__doc__.strip(), "", "The main study (no command):", "", main,
                      "Your own experiment (--topo and --traffic, or --experiment):", "", own])


if __name__ == "__main__":
    if not __package__:
        _as_module()
    sys.exit(entry(sys.argv[1:]))
