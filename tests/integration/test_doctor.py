"""The real probes on this machine: they must answer, agree with the kernel and leave nothing behind."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from topo.harness import capabilities as cap

pytestmark = pytest.mark.needs(os.geteuid() != 0, "the qdisc probes create a veth pair and add qdiscs: run as root")

REPO = Path(__file__).resolve().parents[2]
PROBE_LINK = re.compile(r"^qp[0-9a-f]{6}p?$")


def probe_links() -> set[str]:
    return {name for name in os.listdir("/sys/class/net") if PROBE_LINK.match(name)}


@pytest.fixture(scope="module")
def caps() -> list[cap.Capability]:
    before = probe_links()
    probed = cap.probe_all()
    assert probe_links() <= before, "a probe veth was left behind"
    return probed


def test_every_expected_capability_is_reported_once(caps):
    names = [c.name for c in caps]
    assert len(names) == len(set(names))
    expected = {"ovs", "ovs:datapath", "ovs:datapath:netdev", "ovs:datapath:system", "mininet",
                "iperf3", "ethtool", "prometheus", "promtool", "netem", "sysctl:net.core.wmem_default",
                *(f"qdisc:{kind}" for kind in cap.QDISC_ARGS if kind != "netem"),
                *(f"tcp:{algorithm}" for algorithm in cap.STUDY_TCP)}
    assert set(names) == expected
    assert {c.name for c in caps if c.required} == {
        "ovs", "ovs:datapath", "qdisc:htb", "mininet", "iperf3", "ethtool"}


def test_every_missing_optional_capability_is_explained(caps):
    for c in caps:
        if not c.available and not c.required:
            assert cap._family(c.name) in cap.OPTIONAL_CONSEQUENCES, c.name


def test_qdiscs_every_linux_kernel_has_are_found(caps):
    # HTB and the FIFOs are in every kernel the study targets; their absence means a broken probe.
    by_name = {c.name: c for c in caps}
    for name in ("qdisc:htb", "qdisc:pfifo", "qdisc:bfifo"):
        assert by_name[name].available, by_name[name].detail


def test_cached_qdisc_answers_match_the_report(caps):
    by_name = {c.name: c for c in caps}
    assert cap.netem_available() == by_name["netem"].available
    assert all(cap.qdisc_available(kind) == by_name[cap._qdisc_name(kind)].available
               for kind in cap.QDISC_ARGS)


def test_tcp_capabilities_agree_with_the_kernel(caps):
    listed = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    assert cap.tcp_algorithms() == listed
    by_name = {c.name: c for c in caps}
    assert by_name["tcp:reno"].available  # reno is built into every kernel
    assert all(by_name[f"tcp:{algorithm}"].available for algorithm in listed if algorithm in cap.STUDY_TCP)


def test_environment_records_kernel_and_datapaths(caps):
    env = cap.environment(caps)
    assert env["kernel"] == os.uname().release
    assert env["netem"] == cap.netem_available()
    assert set(env["datapath_types"]) <= {"netdev", "system"}
    assert env["missing"] == cap.missing(caps)


def test_doctor_command_prints_the_report_and_returns_its_exit_code(caps):
    before = probe_links()
    done = subprocess.run([sys.executable, "-m", "topo.harness.capabilities"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert probe_links() <= before, "a probe veth was left behind"
    assert done.returncode == cap.doctor_exit_code(caps), done.stderr
    last_line = done.stdout.splitlines()[-1]
    assert last_line == cap.verdict(caps)
    assert done.stdout.startswith("capability")


def test_probe_veth_is_removed_even_when_a_probe_fails(monkeypatch):
    def fail(dev: str, kind: str) -> cap.Capability:
        assert dev in probe_links()  # the pair exists while qdiscs are tried
        raise RuntimeError("probe failed")

    before = probe_links()
    monkeypatch.setattr(cap, "_try_qdisc", fail)
    with pytest.raises(RuntimeError):
        cap._qdisc_capabilities.__wrapped__()  # uncached, so the veth is really created
    assert probe_links() == before


def test_probes_survive_missing_programs(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    probed = {c.name: c for c in cap.probe_all()}
    assert not probed["ovs"].available and not probed["iperf3"].available
    assert "No such file or directory" in probed["iperf3"].detail
    assert cap.doctor_exit_code(list(probed.values())) == 1
