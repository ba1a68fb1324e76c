"""What the cc, fairness and aqm commands share: their common flags, the launch (root, probes, a
host free of other studies), the trials under one controller with a progress bar, exit codes for
errors and Ctrl-C, and the results folder (summary.json, table.md, a bar-chart figure, raw/).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from controller.policy import PolicyError, parse_rate
from topo import capabilities, results
from topo.controller_client import ControllerError, controller
from topo.launch import USAGE_ERROR, Host, LaunchError, note, prepare
from topo.progress import ProgressBar
from topo.run import policy_documents
from topo.study import StudyError
from topo.study_report import reasons_text
from topo.trial import SETTLE_SECONDS, TrialContext


class UsageError(ValueError):
    """The command line asks for something that cannot run; the message says what to change."""


@dataclass(frozen=True)
class Settings:
    bottleneck_bps: int
    seconds: float
    queue_packets: int
    quick: bool
    out: Path | None
    datapath: str

    def scenario(self, **extra: Any) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck_bps, "seconds": self.seconds, "settle_seconds": SETTLE_SECONDS,
                "queue_packets": self.queue_packets, "quick": self.quick, **extra}


def parser(prog: str, description: str, *, seconds: float, quick_seconds: float, bottleneck: str,
           queue_packets: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"topo/run.py {prog}", description=description)
    p.add_argument("--quick", action="store_true", help=f"hold each run about {quick_seconds:g} s")
    p.add_argument("--seconds", type=float, help=f"length of each run (default {seconds:g}; with --quick "
                                                 f"{quick_seconds:g})")
    p.add_argument("--bottleneck", default=bottleneck, help=f"bottleneck rate (default {bottleneck})")
    p.add_argument("--queue-packets", type=int, default=queue_packets,
                   help=f"packet limit of the bottleneck queue (default {queue_packets})")
    p.add_argument("--out", type=Path, help="results folder (default results/<timestamp>-<command>)")
    p.add_argument("--datapath", choices=("auto", "user", "kernel"), default="auto",
                   help="OVS datapath; auto picks kernel where the OVS module is loaded, else userspace")
    p.set_defaults(default_seconds=seconds, quick_seconds=quick_seconds)
    return p


def settings(args: argparse.Namespace) -> Settings:
    try:
        bps = parse_rate(args.bottleneck, "--bottleneck")
    except PolicyError as err:
        raise UsageError(str(err)) from None
    seconds = args.seconds if args.seconds is not None else \
        args.quick_seconds if args.quick else args.default_seconds
    if seconds <= SETTLE_SECONDS + 1:
        raise UsageError(f"--seconds: {seconds:g} leaves nothing to measure after the first "
                         f"{SETTLE_SECONDS:g} s; give more than {SETTLE_SECONDS + 1:g}")
    if args.queue_packets < 1:
        raise UsageError(f"--queue-packets: {args.queue_packets} must be at least 1")
    return Settings(bps, seconds, args.queue_packets, args.quick, args.out, args.datapath)


def policy(name: str, setup: Settings, discipline: str = "fifo") -> dict:
    """policies/<name>.yaml with every port's capacity, queue length and discipline the study's."""
    return policy_documents([name], setup.bottleneck_bps, setup.queue_packets, discipline)[name]


def launch(command: str, setup: Settings) -> Host:
    """Root, probes and results folder (topo/launch.py), on a host no other study is using."""
    return prepare(setup.out, setup.datapath, command)


def unavailable(caps: dict[str, capabilities.Capability], names: list[str], family: str) -> dict[str, str]:
    """name → why this host lacks it, for each name whose `family:name` capability is missing."""
    reasons = {}
    for name in names:
        cap = caps.get(f"{family}:{name}")
        if not (cap and cap.available):
            reasons[name] = cap.detail if cap else f"not probed: {family} {name} is unknown to this host"
    return reasons


def choose_tcp(requested: list[str] | None, kernel: list[str],
               caps: dict[str, capabilities.Capability]) -> tuple[list[str], dict[str, str]]:
    """(algorithms to run, skipped → why) of `requested`, default every one the kernel offers: its
    own list (`kernel`) plus the study's algorithms it loads on first use."""
    offered = kernel + [a for a in capabilities.STUDY_TCP if a not in kernel and not unavailable(caps, [a], "tcp")]
    wanted = requested or list(dict.fromkeys([*capabilities.STUDY_TCP, *offered]))
    return [a for a in wanted if a in offered], unavailable(caps, [a for a in wanted if a not in offered], "tcp")


def say_unavailable(what: str, reasons: dict[str, str]) -> None:
    if reasons:
        note(f"{what}: {reasons_text(reasons)}")


def run_trials(host: Host, setup: Settings,
               trials: dict[str, Callable[[TrialContext], dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each trial in turn, under one controller, with a progress bar; raw JSON in raw/<label>/."""
    bar = ProgressBar(total=setup.seconds * len(trials))
    done = {}
    try:
        with controller(host.out / "controller.log") as client:
            for index, (label, run) in enumerate(trials.items()):
                bar.start_part(f"{label} ({index + 1}/{len(trials)})", index * setup.seconds)
                ctx = TrialContext(client, host.datapath, setup.queue_packets,
                                   host.out / "raw" / label.replace(" ", "_"), bar.tick)
                done[label] = run(ctx)
    finally:
        bar.finish()
    return done


def guarded(body: Callable[[], int]) -> int:
    """Run a study command; its errors become one message and an exit code, Ctrl-C exits 130."""
    try:
        return body()
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    except (ControllerError, StudyError, PolicyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: network, processes and queues cleaned up", file=sys.stderr)
        return 130


def finish(out: Path, summary: dict[str, Any], table: str, draw: Callable[[Path], None], figure_name: str) -> int:
    results.write_json(out / "summary.json", summary)
    (out / "table.md").write_text(table)
    draw(out / figure_name)
    print(table)
    print(f"results in {out}")
    return 0
