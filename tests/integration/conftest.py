"""Integration tests need root, a running Open vSwitch and nothing else on the study's names.

A test marked `needs(missing, reason)` whose component is missing is skipped on a developer's machine
and fails on CI (where scripts/setup.sh has installed and started everything): a missing component on
CI is a broken set-up, not a pass."""
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.core.policy import LOCAL_OVSDB
from tests.ci import ON_CI
from topo.harness import host
from topo.harness.host import Busy, HostLock, RunRecord
from topo.harness.launch import remove_what_killed_runs_left


def _ovs_running() -> bool:
    return subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode == 0


requires_root = pytest.mark.needs(os.geteuid() != 0, "needs root (Mininet, Open vSwitch, tc)")
requires_ovs = pytest.mark.needs(os.geteuid() != 0 or not _ovs_running(),
                                 "needs root and a running Open vSwitch (scripts/setup.sh starts it)")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs"):
        missing, reason = mark.args
        if missing:
            if ON_CI:
                pytest.fail(f"{reason}: on CI a missing component is a failure")
            pytest.skip(reason)


# The first test that uses a module- or session-wide fixture pays for its set-up: most run a whole study
# (their subprocess timeouts are 600 s at most). pytest.ini's default is for a test alone.
STUDY_TIMEOUT = 900


def forget_datapaths(*dp_ids: int) -> None:
    """Bridges holding these tests' datapath ids are what a killed run of them left (a teardown removes its own);
    left, they would connect to the next run's controllers as rivals of its bridges. Removed, veths too."""
    for dp_id in dp_ids:
        found = subprocess.run(["ovs-vsctl", "--bare", "--columns=name", "find", "Bridge",
                                f"other_config:datapath-id={dp_id:016x}"], capture_output=True, text=True, check=True)
        for bridge in found.stdout.split():
            ports = subprocess.run(["ovs-vsctl", "list-ports", bridge], capture_output=True, text=True).stdout.split()
            subprocess.run(["ovs-vsctl", "--if-exists", "del-br", bridge], capture_output=True, check=True)
            for port in ports:
                subprocess.run(["ip", "link", "del", port], capture_output=True)


def pytest_collection_modifyitems(items):
    # The unit tests first, beside the VM study (tests/conftest.py starts it), then the VM test, which needs no
    # OVS (the container image's first build runs beside it: test_image.py), then the rest.
    items.sort(key=lambda item: (not item.module.__name__.startswith("tests.unit."),
                                 item.module.__name__ != "tests.integration.test_vm"))
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        defs = getattr(item, "_fixtureinfo", None)
        wide = [d for ds in (defs.name2fixturedefs.values() if defs else ()) for d in ds
                if d.scope in ("module", "session", "package") and d.argname != "host_to_ourselves"
                and d.func.__module__.startswith("tests.")]   # ours, not pytest's (tmp_path_factory)
        if wide:
            item.add_marker(pytest.mark.timeout(STUDY_TIMEOUT))


def _present() -> dict[str, set[str]]:
    """What is there now. A command that fails raises: with OVS down, "no bridge left" would be no check."""
    def out(*args):
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}; what a run "
                               "leaves behind cannot be checked")
        return {line for line in done.stdout.splitlines() if line}
    def alive(pattern: str) -> set[str]:
        """Processes whose command line matches, zombies left out (a dead parent's are reaped by init later)."""
        return {line for line in out("ps", "-ww", "-eo", "pid=,stat=,args=") if pattern in line.split(None, 2)[-1]
                and not line.split()[1].startswith("Z")}
    return {"bridges": out("ovs-vsctl", "--timeout=10", "list-br"),
            "qos": out("ovs-vsctl", "--timeout=10", "--columns=_uuid", "list", "QoS"),
            "queues": out("ovs-vsctl", "--timeout=10", "--columns=_uuid", "list", "Queue"),
            "iperf3": {line for line in alive("iperf3") if line.split(None, 2)[-1].split()[0].endswith("iperf3")},
            "controller": alive("-manager ")}


_BEFORE: dict[str, set[str]] = {}


def leftovers() -> dict[str, str]:
    """What a run must not leave behind: bridges, QoS/Queue rows, iperf3, controllers; only what was not
    there before the tests began (another tool's bridge is not ours to judge)."""
    return {what: "\n".join(sorted(lines - _BEFORE.get(what, set()))) for what, lines in _present().items()}


@pytest.fixture(scope="session", autouse=True)
def host_to_ourselves(request):
    """Wait for a study or benchmark that holds the host (their traffic and bridges would spoil ours), remove
    what a killed one left as `topo/run.py clean` does (its s1-eth1 made every Mininet network of the study's
    names fail with "File exists"), then note what is already there."""
    if os.geteuid() != 0:
        yield
        return
    deadline = time.monotonic() + 30 * 60
    while True:
        try:
            removed = remove_what_killed_runs_left()   # the launchers under test take the lock themselves
            break
        except Busy:
            if time.monotonic() > deadline:
                pytest.exit("another study or benchmark has held this host for 30 minutes", returncode=3)
            time.sleep(1)
    if removed:   # said on the terminal, past the capture of the first test's set-up
        with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            request.config.pluginmanager.get_plugin("terminalreporter").write_line(
                f"removed what a killed run left behind: {', '.join(removed)}")
    if _ovs_running():   # else the tests that need it are skipped (failed on CI); leftovers() would raise
        _BEFORE.update(_present())
    yield


@pytest.fixture(scope="module")
def recorded() -> Iterator[RunRecord]:
    """A run record for tests that build their own networks, held as a launcher holds its own: a suite killed
    inside them leaves what the next suite (or `topo/run.py clean`) removes. Closed after each test's own
    leftovers() check, so it never hides what a test failed to remove."""
    lock = HostLock()
    record, _ = lock.acquire(Path("(tests)"))   # the session began by removing what a killed run left
    yield record
    record.close()
    lock.release()


def remove_rows(owner: str) -> int:
    """Every QoS and Queue row of `owner` in the system's OVSDB taken off its port and removed, as the launcher
    removes a dead run's: what a test's controllers left. How many rows went."""
    return host.remove_rows(owner, LOCAL_OVSDB)


NOTHING_LEFT = {"bridges": "", "qos": "", "queues": "", "iperf3": "", "controller": ""}


REPO = Path(__file__).resolve().parents[2]
OSKEN = REPO / ".venv" / "bin" / "osken-manager"
QUICK_STUDY_POLICIES = ("none", "police", "reserve", "auto")
# A quick study of the main one's onset (2 Mbit/s) and its two heaviest steps only, nothing after TCP
# ends: what the tests of another way to run the study (Ryu, a second OVS) compare with the main one. A
# flood that starts at 10 Mbit/s drops 60 % of TCP's window before auto can answer, and TCP's own loss
# recovery then took 4.9 s in one CI run: TCP's doing, not the controller's.
FLOOD_ONLY = ("--quick", "--udp-steps", "0,2,10,12", "--lone-udp", "0")
# What `auto` promises a user: the flood steered into its class within its first second, so TCP keeps its
# reservation. How fast (the goal is 0.15 s) is bench/reaction.py's to measure over many onsets: one onset on a
# loaded CI host took 0.504 s.
STEERED_WITHIN_S = 1.0


@pytest.fixture(scope="session")
def quick_study(tmp_path_factory):
    """One quick main-study run of QUICK_STUDY_POLICIES, shared by the modules that read its results:
    (results folder, summary, what was left behind right after it). The steps the tests read: idle,
    the flood's onset and the two heaviest (the probe's too)."""
    out = tmp_path_factory.mktemp("study")
    done = subprocess.run([sys.executable, "topo/run.py", "--policy", *QUICK_STUDY_POLICIES, "--quick",
                           "--udp-steps", "0,2,10,12", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out, json.loads((out / "summary.json").read_text()), leftovers()


def controller_config(path: Path, ofp_port: int = 6653, default: dict | None = None, **qos) -> Path:
    """A config file: the shipped one's [DEFAULT] (OpenFlow on `ofp_port`, and `default`'s options) and
    these [qos] options."""
    qos.setdefault("state_file", str(path.with_name("state.json")))
    qos.setdefault("owner", "test")
    text = (REPO / "controller" / "qos.conf").read_text().split("[qos]")[0]
    text = text.replace("ofp_tcp_listen_port = 6653", f"ofp_tcp_listen_port = {ofp_port}")
    text += "".join(f"{k} = {v}\n" for k, v in (default or {}).items())
    text += "[qos]\n" + "".join(f"{k} = {v}\n" for k, v in qos.items())
    path.write_text(text)
    return path


def start_controller(config, log):
    """The real controller process; wait for its REST API (or its exit, for the tests of refusals)."""
    import time
    import urllib.request
    out = open(log, "w")
    proc = subprocess.Popen([str(OSKEN), "--config-file", str(config), str(REPO / "controller" / "qos_app.py")],
                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen("http://127.0.0.1:8080/qos/v1/status", timeout=1)
            return proc
        except OSError:
            time.sleep(0.2)
    return proc


def stop_controller(proc, clear=True) -> None:
    import signal
    import urllib.request
    if clear and proc.poll() is None:
        try:
            urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8080/qos/v1/policy", method="DELETE"),
                                   timeout=10)
        except OSError:
            pass
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def userspace_bridge(vsctl, name: str, dp_id: int, controller: str, links: list[str], instance=None,
                     ports: int = 2) -> None:
    """A userspace bridge on the system's OVS (`vsctl`) or on `instance` (topo/net/ovs_instance.py), with
    `ports` veth ports numbered from 1, pointed at `controller`. Each veth's outer end goes into `links`:
    deleting it deletes its peer, wherever that is."""
    if instance is None:
        forget_datapaths(dp_id)
    args = []
    for port in range(1, ports + 1):
        link = f"{name}p{port}"
        subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", link + "x"], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        links.append(link + "x")
        if instance:
            instance.move(link)
        args += ["--", "add-port", name, link, "--", "set", "interface", link, f"ofport_request={port}"]
    vsctl("add-br", name, "--", "set", "bridge", name, "datapath_type=netdev", "protocols=OpenFlow13",
          "fail_mode=secure", f"other_config:datapath-id={dp_id:016x}", *args)
    vsctl("set-controller", name, controller)
