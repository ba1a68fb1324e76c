"""Hand mutations of the core (controller/core/) and the fidelity monitor, each run against the unit tests
in a copy of the tree: a mutant the tests do not kill is a claim no test checks (docs/testing.md).

    .venv/bin/python tests/mutants.py                 # every hand mutant, two at a time (about 30 minutes)
    .venv/bin/python tests/mutants.py plan-match ...  # these only
    .venv/bin/python tests/mutants.py --list
    .venv/bin/python tests/mutants.py --head          # the last commit's tree, not the working tree's
    .venv/bin/python tests/mutants.py plan-match --tests tests/unit/test_claims.py   # does this test kill it?
    .venv/bin/python tests/mutants.py --head --sweep      # the generated mutants of the core (tests/sweep.py)
    .venv/bin/python tests/mutants.py 'role.RoleManager.claim:if#1' --sweep role --tests tests/unit/test_switch.py

The unmutated copy is run first: if its unit tests fail (someone's work in progress), every mutant would
look killed, so the run stops there (use --head, or finish the work). Each mutant is one textual change (`old` must occur exactly once in its file, so a refactor that moves
the code makes the mutant fail loudly rather than test nothing). The tree is copied to a temporary
directory per worker and mutated there, never in place. Exit 1 if a mutant survives that is not in
EQUIVALENT, or if a mutant no longer applies.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import sweep

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".git", ".venv*", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                                "*.qcow2", "*.img", "results", "runs")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str


M = Mutant
MUTANTS = [
    # --- the audit's list ------------------------------------------------------------------------------
    M("plan-match", "controller/core/plan.py",
      "if entry is None or (entry.priority, entry.match) != (flow.priority, flow.match):",
      "if entry is None or entry.priority != flow.priority:"),
    M("plan-steered", "controller/core/plan.py",
      "desired_qos = state.qos(state.reserving | steered_ports(flows))", "desired_qos = state.qos(state.reserving)"),
    M("tc-limit", "controller/core/plan.py",
      "if leaves.get(c) != want)", "if (leaves.get(c) or (None,))[0] != want[0])"),
    M("hot-ge", "controller/core/congestion.py",
      "sample.utilisation >= self.utilisation", "sample.utilisation > self.utilisation"),
    M("meters-policed-counted", "controller/core/meters.py",
      " and rule.traffic_class not in policed}", "}"),
    M("tc-sweep", "controller/core/portjobs.py",
      "            self.check |= set(self.ifindex)\n", "            pass\n"),
    M("standby-sweeps", "controller/core/controller.py",
      "elif self.authority.active:   # rows of ours", "else:   # rows of ours"),
    M("fast-poll-bound", "controller/core/policy.py",
      "if fast and not 0.01 <= fast <= poll_interval:", "if fast and not 0.01 <= fast:"),
    M("monitor-drops", "topo/harness/fidelity.py",
      "cls: leaf.drops - self._first[cls].drops", "cls: leaf.drops"),
    M("plan-reserving-now", "controller/core/plan.py",
      "desired_flows = state.flows(state.reserving & reserving_now)", "desired_flows = state.flows(state.reserving)"),
    M("worker-lock", "controller/adapters/worker.py",
      "        if not self._may_write():\n", "        if False:\n"),
    # --- more of the core ------------------------------------------------------------------------------
    M("hot-streak", "controller/core/congestion.py",
      "if self._hot_streak < config.samples:", "if self._hot_streak <= config.samples:"),
    M("hold-time", "controller/core/congestion.py",
      "if calm_for < config.hold_seconds:", "if calm_for < 0:"),
    M("calm-not-hot", "controller/core/congestion.py",
      "return quiet and not self.is_hot(sample)", "return quiet"),
    M("loss-competing", "controller/core/congestion.py",
      "lossy = sample.competing and sample.loss_ratio", "lossy = sample.loss_ratio"),
    M("plan-modify", "controller/core/plan.py",
      "elif held.actions != entry.actions:", "elif False:"),
    M("plan-foreign", "controller/core/plan.py",
      "        if actual == FOREIGN:\n            continue\n", ""),
    M("plan-absent", "controller/core/plan.py",
      "qos = {p: q for p, q in qos.items() if q != ABSENT}", "qos = dict(qos)"),
    M("tc-waiting", "controller/core/plan.py",
      "if not set(wanted) <= classes:", "if False:"),
    M("tc-filters-userspace", "controller/core/plan.py",
      "spec.marks if userspace and filters != marks else None", "spec.marks if filters != marks else None"),
    M("drift-while-busy", "controller/core/portjobs.py",
      "ABSENT) and port_no not in self.busy:", "ABSENT):"),
    M("job-error-retry", "controller/core/portjobs.py",
      "self._errors[key] = result.error\n                self.failed.add(job.port_no)\n",
      "self._errors[key] = result.error\n"),
    M("missing-twice", "controller/core/portjobs.py",
      "if job.port_no in self.missing:", "if True:"),
    M("leaves-changed-check", "controller/core/portjobs.py",
      "if self.specs.get(port_no) != wanted:", "if False:"),
    M("batch-refused-retry", "controller/core/flowsync.py",
      '            self.failed = True\n', '            self.failed = False\n'),
    M("flow-count", "controller/core/flowsync.py",
      "reply.count != len(self.flows)", "False"),
    M("one-batch", "controller/core/flowsync.py",
      "elif (changes or meters) and not self.batches and not self.failed:",
      "elif (changes or meters) and not self.failed:"),
    M("meters-gone-read", "controller/core/flowsync.py",
      "            self.meters = None\n            self.link.ask(act.METER_CONFIG)\n\n    # --- changes",
      "            self.meters = None\n\n    # --- changes"),
    M("whole-table", "controller/core/poller.py",
      "whole = self.table_polls == 0", "whole = False"),
    M("fast-decides", "controller/core/poller.py",
      "if not round_.fast and fast and port_no in self.watched:", "if False:"),
    M("idle-skip", "controller/core/poller.py",
      "and not drops.get(port_no) and state.resting(port_no):", "and not drops.get(port_no):"),
    M("writable-active", "controller/core/role.py",
      "return view.confirmed and self.role is SwitchRole.MASTER", "return self.role is SwitchRole.MASTER"),
    M("demoted", "controller/core/role.py",
      "        if self.role is SwitchRole.MASTER:\n            self.role = SwitchRole.SLAVE",
      "        if False:\n            self.role = SwitchRole.SLAVE"),
    M("heartbeat-moves", "controller/core/authority.py",
      "if self._beat is None or self._beat[0] != change.heartbeat or stale:", "if self._beat is None or stale:"),
    M("claim-again", "controller/core/authority.py",
      "return self.need(0, self.above) if self.above > generation else []", "return []"),
    M("same-policy-while-saving", "controller/core/peers.py", "        return not saving\n", "        return True\n"),
    M("confirm-deadline", "controller/core/keeper.py",
      "if not (done or now >= change.deadline):", "if not done:"),
    M("not-connected", "controller/core/keeper.py",
      "not_in_sync |= {f\"{dp_id:016x}\": peers.absent", "not_in_sync & {f\"{dp_id:016x}\": peers.absent"),
    M("bridge-gone-sweep", "controller/core/controller.py",
      "if sw.bridge is not None and self.authority.active:", "if False:"),
    M("carry-reserving", "controller/core/switch_state.py",
      "if port.port_no in previous.reserving:", "if False:"),
    M("competing-two", "controller/core/switch_state.py",
      "competing=not class_bps or len(recent) >= 2", "competing=not class_bps or len(recent) > 2"),
    M("shortfall", "controller/core/switch_state.py",
      "rate >= keep * short.min_share * cap", "rate >= short.min_share * cap"),
    M("ovsdb-changed-poll", "controller/core/switch.py",
      "if (retry or moved) and not self.jobs.busy:", "if retry and not self.jobs.busy:"),
    M("in-sync-errors", "controller/core/switch.py",
      "or self.jobs.changing()\n                            or self.errors())",
      "or self.jobs.changing())"),
    M("counter-wrap", "controller/core/stats.py",
      "elif before > _WRAP_FLOOR:", "elif False:"),
    # --- the heap keeper and the shared lease rule ----------------------------------------------------------
    M("heap-any-generation", "controller/adapters/heap.py",
      'if info["generation"] != 2:', 'if info["generation"] == 1:'),
    M("heap-no-thaw", "controller/adapters/heap.py", "        gc.unfreeze()\n", "        pass\n"),
    M("safe-share-le", "controller/core/cluster.py",
      "now - confirmed_at < SAFE_SHARE * lease", "now - confirmed_at <= SAFE_SHARE * lease"),
    # --- the seam for high availability (controller/core/ha.py): each way's fence ----------------------------
    M("member-epoch", "controller/core/member.py",
      "fenced.\"\"\"\n        return self.cluster.mine.get(dp_id, 0)", "fenced.\"\"\"\n        return 0"),
    M("alone-fences", "controller/core/authority.py",
      "there is no one to fence: no condition.\"\"\"\n        return 0",
      "there is no one to fence: no condition.\"\"\"\n        return self.generation"),
    # --- issue 46's behaviours no test pinned (tests/unit/test_pinned.py) ------------------------------------
    M("refused-still-master", "controller/core/role.py", "        self.role = SwitchRole.REFUSED\n", ""),
    M("refused-never-asks", "controller/core/role.py", "        self.ask()\n        return True", "        return True"),
    M("generation-plain", "controller/core/role.py",
      "return (ours - theirs) % 2**64 < 2**63", "return ours >= theirs"),
    M("lease-past-takeover", "controller/core/authority.py", "LEASE_SECONDS = 3.0 ", "LEASE_SECONDS = 9.0 "),
    M("flow-error-stays", "controller/core/flowsync.py", '            self._errors.pop("flows", None)\n', ""),
    M("load-error-stays", "controller/core/keeper.py", "            self.load_error = False\n", ""),
    M("confirm-early", "controller/core/keeper.py", "now + CONFIRM_SECONDS, named", "now + 1.0, named"),
    M("clear-loss-le", "controller/core/congestion.py",
      "sample.loss_ratio < self.clear_loss_ratio", "sample.loss_ratio <= self.clear_loss_ratio"),
    M("stall-catch-up", "controller/core/poller.py",
      "self.next_due = due.due + interval * (1 + max(lag, 0.0) // interval)", "self.next_due = due.due + interval"),
    M("stall-phase-lost", "controller/core/poller.py",
      "self.next_due = due.due + interval * (1 + max(lag, 0.0) // interval)",
      "self.next_due = max(due.due + interval, now)"),
    M("fast-at-hot", "controller/core/poller.py",
      "busy = tx_bps >= state.policy.congestion.clear_utilisation * port.capacity_bps",
      "busy = tx_bps >= state.policy.congestion.utilisation * port.capacity_bps"),
    M("epoch-every-reconcile", "controller/core/portjobs.py", "if epoch > self.epoch else ()", "if epoch else ()"),
    M("missing-not-forgotten", "controller/core/portjobs.py",
      "        if not result.missing:\n            self.missing.discard(job.port_no)\n",
      "        if not result.missing:\n            pass\n"),
    M("whole-fraction", "controller/core/policy.py",
      "if number != value and not isinstance(value, str) or not low <= number <= high:",
      "if not low <= number <= high:"),
    M("foreign-outside-policy", "controller/core/plan.py",
      "{p: None for p, q in qos.items() if isinstance(q, OvsdbQos)}", "{p: None for p, q in qos.items() if q is not None}"),
]

# Mutants no test can kill because they change nothing a user can see, each with the reason.
EQUIVALENT: dict[str, str] = {
    "standby-sweeps": "the worker refuses every write from a controller without the lock, the sweep included "
                      "(that guard is mutant worker-lock, which test_claims.py kills)",
    "tc-filters-userspace": "for a kernel-datapath port the worker reads no filters and passes an empty set, "
                            "which equals the empty marks such a port wants",
}


PYTEST = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--timeout=120"]
TESTS = ["tests/unit"]


def run(mutant: Mutant, work: Path, timeout: float) -> tuple[str, float]:
    """'killed', 'survived', or why it could not run; and the seconds it took."""
    target = work / mutant.path
    original = target.read_text()
    if original.count(mutant.old) != 1:
        return f"stale: the text to mutate occurs {original.count(mutant.old)} times", 0.0
    target.write_text(original.replace(mutant.old, mutant.new))
    for cached in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        cached.unlink()   # a bytecode cache of the same size and second would be taken for the mutated file
    start = time.monotonic()
    try:
        done = subprocess.run(PYTEST + TESTS, cwd=work, capture_output=True, timeout=timeout)
        outcome = "survived" if done.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        outcome = "killed (hung)"
    finally:
        target.write_text(original)
    return outcome, time.monotonic() - start


def copy_tree(work: Path, head: bool) -> None:
    if head:
        work.mkdir()
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    else:
        shutil.copytree(ROOT, work, ignore=IGNORE, symlinks=True)
    # A repository of its own: a test that asks git which files are tracked (test_topo_layout) asks the copy.
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "add", "-A"], cwd=work, check=True)
    if (ROOT / ".venv").exists():   # the launcher's tests run topo/run.py, which wants the tree's venv
        (work / ".venv").symlink_to((ROOT / ".venv").resolve())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once (each in its own copy)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one mutant's run may take")
    parser.add_argument("--head", action="store_true", help="mutate the last commit's tree, not the working tree's")
    parser.add_argument("--tests", nargs="+", default=TESTS, metavar="PATH",
                        help="the tests to run against each mutant (default: tests/unit): a quick check of the "
                             "tests meant to kill them")
    parser.add_argument("--sweep", nargs="*", metavar="MODULE", choices=sweep.SWEPT,
                        help="the generated mutants of these modules of the core instead (none named: all of "
                             f"{', '.join(sweep.SWEPT)}), each against the unit tests that reach it")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)     # a sweep's worker, in its tree
    parser.add_argument("--trace", type=Path, nargs=2, help=argparse.SUPPRESS)   # its line map: tree, output
    args = parser.parse_args()
    if args.serve:
        sweep.serve(args.serve, args.timeout)
        return 0
    if args.trace:
        return sweep.trace(*args.trace)
    if args.sweep is not None:
        return sweep_run(tuple(args.sweep) or sweep.SWEPT, args)
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:28} {m.path}")
        return 0
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no such mutant: {', '.join(sorted(unknown))}")
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    TESTS[:] = args.tests
    with tempfile.TemporaryDirectory(prefix="mut-") as tmp:
        works = trees(Path(tmp), min(args.jobs, len(chosen)), args.head)
        baseline = subprocess.run(PYTEST + TESTS, cwd=works[0], capture_output=True, text=True)
        if baseline.returncode != 0:
            print("the unmutated tree fails its unit tests; no mutant can be judged:\n" + baseline.stdout[-3000:])
            return 2
        print("unmutated: the unit tests pass", flush=True)
        free = list(works)

        def one(mutant: Mutant) -> tuple[Mutant, str, float]:
            work = free.pop()
            try:
                return (mutant, *run(mutant, work, args.timeout))
            finally:
                free.append(work)

        bad = 0
        with concurrent.futures.ThreadPoolExecutor(len(works)) as pool:
            for mutant, outcome, seconds in pool.map(one, chosen):
                note = ""
                if outcome == "survived":
                    reason = EQUIVALENT.get(mutant.name)
                    note = f"  (equivalent: {reason})" if reason else ""
                    bad += reason is None
                elif outcome.startswith("stale"):
                    bad += 1
                print(f"{mutant.name:28} {outcome:14} {seconds:5.0f} s  {mutant.path}{note}", flush=True)
    return 1 if bad else 0


def trees(tmp: Path, count: int, head: bool) -> list[Path]:
    works = []
    for i in range(max(1, count)):
        work = tmp / f"tree{i}"
        copy_tree(work, head)
        works.append(work)
    return works


# The sweep's survivors argued equivalent: the rows of docs/testing.md's table that name one ("| `name` | why |").
ARGUED = re.compile(r"^\| `([\w.]+:\w+#\d+)` \|", re.MULTILINE)


def sweep_run(modules: tuple[str, ...], args: argparse.Namespace) -> int:
    """The generated mutants of `modules`, each against the tests that reach its lines; exit 1 if one survives that
    docs/testing.md does not argue equivalent."""
    argued = set(ARGUED.findall((ROOT / "docs" / "testing.md").read_text()))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mut-") as tmp:
        works = trees(Path(tmp), args.jobs, args.head)
        mutants = [m for m in sweep.generate(works[0], modules) if not args.names or m.name in args.names]
        if args.tests != ["tests/unit"]:   # these tests only, for every mutant: a quick check of a new test
            chosen = args.tests
        else:
            traced_file = Path(tmp) / "traced.json"
            traced = subprocess.run([sys.executable, __file__, "--trace", str(works[0]), str(traced_file)],
                                    capture_output=True, text=True)
            if traced.returncode != 0:
                print("the unmutated tree fails its unit tests; no mutant can be judged:\n" + traced.stdout[-3000:])
                return 2
            reached = json.loads(traced_file.read_text())
        print(f"unmutated: the unit tests pass; {len(mutants)} mutants of {', '.join(modules)}", flush=True)
        servers = [subprocess.Popen([sys.executable, __file__, "--serve", str(work), "--timeout",
                                     str(min(args.timeout, 120.0))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True) for work in works]
        free = list(servers)
        texts = {m.path: (works[0] / m.path).read_text() for m in mutants}

        def one(mutant: sweep.Generated) -> tuple[sweep.Generated, str, float]:
            tests = chosen if args.tests != ["tests/unit"] else sweep.tests_for(mutant, reached)
            if not tests:
                return mutant, "survived (no test reaches it)", 0.0
            text = mutant.apply(texts[mutant.path])
            if text is None:
                return mutant, "stale", 0.0
            server = free.pop()
            try:
                assert server.stdin is not None and server.stdout is not None
                server.stdin.write(json.dumps({"path": mutant.path, "text": text, "tests": tests}) + "\n")
                server.stdin.flush()
                outcome, seconds = json.loads(server.stdout.readline())
                return mutant, outcome, seconds
            finally:
                free.append(server)

        counts: dict[str, int] = {}
        bad, spent = 0, 0.0
        with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
            for mutant, outcome, seconds in pool.map(one, mutants):
                spent += seconds
                kind = "killed" if outcome.startswith("killed") else "stale" if outcome == "stale" else \
                    "equivalent" if mutant.name in argued else "survived" if outcome == "survived" else "unreached"
                counts[kind] = counts.get(kind, 0) + 1
                bad += kind not in ("killed", "equivalent")
                if kind != "killed" or args.names:
                    print(f"{mutant.name:48} {outcome:30} {mutant.shown}", flush=True)
        for server in servers:
            assert server.stdin is not None
            server.stdin.close()
            server.wait()
    minutes = (time.monotonic() - started) / 60
    print(f"{len(mutants)} mutants in {minutes:.0f} min ({spent / max(1, len(mutants)):.1f} s of tests a mutant): "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
