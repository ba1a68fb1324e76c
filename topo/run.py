"""The study launcher:  sudo python3 topo/run.py --policy none reserve auto [--quick] [--out DIR]

Runs each policy in turn on a fresh Mininet network under the QoS controller (one already on
127.0.0.1:6653, or one it starts and stops), then writes raw iperf3 JSON, summary.json, a table
and a figure to DIR (default results/<timestamp>/).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def _reexec_in_venv() -> None:
    """Run under the project's venv whatever `python3` root has on PATH."""
    if Path(sys.prefix).resolve() == (REPO / ".venv").resolve():
        return
    if not VENV_PYTHON.exists():
        sys.exit(f"error: {REPO / '.venv'} is missing; run scripts/setup.sh first (as root)")
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])


if __name__ == "__main__":
    _reexec_in_venv()
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

from controller.policy import PolicyError, parse_policy  # noqa: E402
from topo import results  # noqa: E402
from topo.controller_client import ControllerError, controller  # noqa: E402
from topo.episodes import episodes  # noqa: E402
from topo.launch import USAGE_ERROR, LaunchError, note, prepare  # noqa: E402
from topo.live import LiveThroughput  # noqa: E402
from topo.prom import PrometheusError, prometheus, query_range, tcp_throughput_query  # noqa: E402
from topo.progress import ProgressBar  # noqa: E402
from topo.scenario import Scenario, ScenarioError, load_scenario  # noqa: E402
from topo.study import Progress, StudyError, run_policy  # noqa: E402

# Other studies and the host check, as subcommands: topo/run.py cc|fairness|aqm|doctor [options]
COMMANDS = {"cc": "topo.cc_study", "fairness": "topo.fairness_study", "aqm": "topo.aqm_study",
            "doctor": "topo.capabilities"}


def entry(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    return main(argv)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="topo/run.py", description=__doc__.splitlines()[0])
    p.add_argument("--policy", nargs="+", default=["none", "reserve"], metavar="NAME",
                   help="policies/<NAME>.yaml (or a path), run in this order (default: none reserve)")
    p.add_argument("--quick", action="store_true", help="hold each step about 3 s: a run well under 2 minutes")
    p.add_argument("--out", type=Path, help="results folder (default results/<timestamp>)")
    p.add_argument("--scenario", type=Path, help="YAML file of scenario fields (flags override it)")
    p.add_argument("--bottleneck", help="bottleneck rate, e.g. 5Mbit (default 5Mbit)")
    p.add_argument("--delay", help="one-way delay on the h1–h4 path where netem exists, e.g. 5ms; 'none' for none")
    p.add_argument("--udp-steps", help="offered UDP rates in Mbit/s, e.g. 0,2,4,6,8,10,12")
    p.add_argument("--step-seconds", type=float, help="how long each UDP step lasts (default 10)")
    p.add_argument("--queue-packets", type=int, help="FIFO limit of the bottleneck queues (default 25)")
    p.add_argument("--cc", dest="tcp_congestion_control", help="TCP congestion control (default: the kernel's)")
    p.add_argument("--prometheus", choices=("auto", "none"), default="auto",
                   help="auto: record series in the Prometheus on 127.0.0.1:9090, or start Debian's "
                        "with its data in DIR/prometheus; none: no time series")
    p.add_argument("--metrics-port", type=int, default=9102, help="launcher exporter port on 127.0.0.1")
    p.add_argument("--datapath", choices=("auto", "user", "kernel"), default="auto",
                   help="OVS datapath; auto picks kernel where the OVS module is loaded, else userspace")
    return p.parse_args(argv)


def scenario_from(args: argparse.Namespace) -> Scenario:
    steps = None
    if args.udp_steps:
        try:
            steps = [float(s) for s in args.udp_steps.split(",")]
        except ValueError:
            raise ScenarioError(f"--udp-steps: {args.udp_steps!r} is not a comma-separated list of numbers") from None
    scenario = load_scenario(args.scenario, {"bottleneck": args.bottleneck, "delay": args.delay,
                                             "udp_steps_mbps": steps,
                                             "tcp_congestion_control": args.tcp_congestion_control,
                                             "queue_packets": args.queue_packets})
    if args.quick:
        scenario = scenario.quick()
    if args.step_seconds is not None:
        scenario = dataclasses.replace(scenario, step_seconds=args.step_seconds)   # validated on construction
    return scenario


def policy_documents(names: list[str], capacity_bps: int, queue_packets: int,
                     discipline: str = "fifo") -> dict[str, dict]:
    """Load and validate every policy before anything starts; every port gets the scenario's
    bottleneck rate and queue."""
    documents = {}
    for name in names:
        path = Path(name) if name.endswith((".yaml", ".yml")) else REPO / "policies" / f"{name}.yaml"
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError:
            raise PolicyError(f"--policy {name}: no file {path}; choose one of "
                              f"{', '.join(p.stem for p in sorted((REPO / 'policies').glob('*.yaml')))}") from None
        except yaml.YAMLError as err:
            raise PolicyError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        for switch in (doc or {}).get("switches", {}).values():
            for port in (switch or {}).get("ports", {}).values():
                port["capacity"] = capacity_bps
                port["queue_packets"] = queue_packets
                port["discipline"] = discipline
        policy = parse_policy(doc)
        documents[policy.name] = doc
    return documents


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        scenario = scenario_from(args)
        documents = policy_documents(args.policy, scenario.bottleneck_bps, scenario.queue_packets)
    except (ScenarioError, PolicyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_ERROR
    try:
        host = prepare(args.out, args.datapath)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    env, out = host.environment, host.out
    if scenario.tcp_congestion_control and scenario.tcp_congestion_control not in env["tcp_congestion_control"]:
        print(f"error: --cc {scenario.tcp_congestion_control}: this kernel offers only "
              f"{', '.join(env['tcp_congestion_control'])}", file=sys.stderr)
        return USAGE_ERROR
    delay = scenario.delay if scenario.delay and env["netem"] else None
    notes = [f"netem is missing from this kernel: the {scenario.delay} delay is NOT applied"] \
        if scenario.delay and not delay else []
    for message in notes:
        note(message)
    summary: dict[str, Any] = {
        "scenario": {**_fields(scenario), "tcp_seconds": scenario.tcp_seconds},
        "bottleneck_mbps": scenario.bottleneck_bps / 1e6,
        "environment": {**env, "delay_applied": delay, "notes": notes},
        "policies": {},
    }
    bar = ProgressBar(total=scenario.tcp_seconds * len(documents))
    live = LiveThroughput(args.metrics_port)
    try:
        with prometheus(out / "prometheus", args.prometheus) as prom_url, controller(out / "controller.log") as client:
            for index, (name, doc) in enumerate(documents.items()):
                bar.start_part(f"{name} ({index + 1}/{len(documents)})", index * scenario.tcp_seconds)
                result = run_policy(doc, scenario, client, out / "raw" / name, host.datapath, delay,
                                    Progress(tick=bar.tick, step=lambda mbps, name=name: live.step(name, mbps)))
                result.update(_reservation(doc, scenario.bottleneck_bps))
                if result["decisions"] and "tcp_reservation_mbps" in result:
                    found = episodes(result["steps"], result["decisions"], result["tcp_series"],
                                     result["tcp_reservation_mbps"])
                    result.update(episodes=found, reaction_seconds=[e["reaction_seconds"] for e in found],
                                  recovery_seconds=[e["recovery_seconds"] for e in found])
                summary["policies"][name] = result
            if prom_url:
                summary["prometheus"] = _recorded(prom_url, summary["policies"], out / "prometheus")
        bar.finish()
    except KeyboardInterrupt:
        bar.finish()
        print("interrupted: network, processes and queues cleaned up", file=sys.stderr)
        return 130
    except (ControllerError, StudyError, PrometheusError) as err:
        bar.finish()
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        live.close()
    results.write_json(out / "summary.json", summary)
    (out / "table.md").write_text(results.table(summary))
    results.figure(summary, out / "throughput.png")
    print(results.table(summary))
    print(f"results in {out}")
    return 0


def _recorded(url: str, policies: dict[str, dict], data_dir: Path) -> dict[str, Any]:
    """What Prometheus holds of each policy's TCP throughput: the query and its points."""
    time.sleep(2)   # the last second's scrape
    recorded = {"url": url, "data_dir": str(data_dir), "queries": {}}
    for name, result in policies.items():
        expr = tcp_throughput_query(name)
        start = result["t0"]
        points = query_range(url, expr, start, start + result["cooldown"]["end_s"])
        recorded["queries"][name] = {"expr": expr, "start": start, "points": len(points),
                                     "mean_mbps": round(sum(v for _, v in points) / len(points), 3) if points else None}
    return recorded


def _reservation(doc: dict, capacity_bps: int) -> dict[str, float]:
    """The TCP class's reserved rate, for policies that can reserve."""
    policy = parse_policy(doc)
    tcp = next((c for c in policy.classes if c.name == "tcp"), None)
    reserves = any(p.queues != "fifo" for s in policy.switches for p in s.ports)
    return {"tcp_reservation_mbps": round(tcp.min_share * capacity_bps / 1e6, 3)} if tcp and reserves else {}


def _fields(scenario: Scenario) -> dict[str, Any]:
    return {"bottleneck": scenario.bottleneck_bps, "delay": scenario.delay,
            "udp_steps_mbps": list(scenario.udp_steps_mbps), "step_seconds": scenario.step_seconds,
            "settle_seconds": scenario.settle_seconds, "cooldown_seconds": scenario.cooldown_seconds,
            "tcp_congestion_control": scenario.tcp_congestion_control, "queue_packets": scenario.queue_packets}


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
