"""The pure parts of topo.harness.capabilities, on output captured from real commands; no root needed."""
from pathlib import Path

import pytest

from topo.harness import capabilities as cap
from topo.harness.capabilities import Capability

# Captured on the Debian 12 build machine (kernel 6.18, no loadable modules).
OVS_VSCTL_VERSION = "ovs-vsctl (Open vSwitch) 3.1.0\nDB Schema 8.3.1\n"
IPERF3_VERSION = ("iperf 3.12 (cJSON 1.7.15)\nLinux vm 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0 x86_64\n"
                  "Optional features available: CPU affinity setting, IPv6 flow label\n")
PROMETHEUS_VERSION = ("prometheus, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5+deb12u1)\n"
                      "  build user:       team+pkg-go@tracker.debian.org\n")
ETHTOOL_VERSION = "ethtool version 6.1\n"
OVS_DPCTL_STDERR = (
    "2026-11-21T11:33:11Z|00001|dpif_netlink|INFO|Generic Netlink family 'ovs_datapath' does not "
    "exist. The Open vSwitch kernel module is probably not loaded.\n"
    "2026-11-21T11:33:11Z|00002|dpif|WARN|failed to enumerate system datapaths: No such file or directory\n")
TC_UNKNOWN_KIND = "Error: Specified qdisc kind is unknown.\n"
TC_RED_OUTPUT = "RED: set bandwidth to 10Mbit\nError: Specified qdisc kind is unknown.\n"
TC_OLD_KERNEL_UNKNOWN = "RTNETLINK answers: No such file or directory\n"
TC_BAD_ARGS = 'Illegal "burst"\nUsage: ... tbf limit BYTES burst BYTES[/BYTES] rate KBPS\n'


def make(name: str, available: bool, required: bool = False, detail: str = "found") -> Capability:
    return Capability(name, available, detail, f"probe {name}", required)


@pytest.mark.parametrize("text, version", [
    (OVS_VSCTL_VERSION, "3.1.0"),
    (IPERF3_VERSION, "3.12"),
    (PROMETHEUS_VERSION, "2.42.0+ds"),
    (ETHTOOL_VERSION, "6.1"),
    ("Open vSwitch 3.1.0; ovsdb-server and ovs-vswitchd answer", "3.1.0"),
    ("not installed: ovs-vsctl: No such file or directory", None),
])
def test_parse_version(text, version):
    assert cap.parse_version(text) == version


@pytest.mark.parametrize("text, items", [
    ("[netdev, system]\n", ["netdev", "system"]),
    ("[netdev]\n", ["netdev"]),
    ("[]\n", []),
    ('["a b", c]', ["a b", "c"]),
])
def test_parse_ovsdb_set(text, items):
    assert cap.parse_ovsdb_set(text) == items


def test_telling_line_strips_ovs_log_prefix_and_keeps_the_first_line():
    assert cap.telling_line(OVS_DPCTL_STDERR) == (
        "Generic Netlink family 'ovs_datapath' does not exist. "
        "The Open vSwitch kernel module is probably not loaded.")


def test_telling_line_prefers_the_error_line():
    assert cap.telling_line(TC_RED_OUTPUT) == "Error: Specified qdisc kind is unknown."
    assert cap.telling_line("\n\n") == "no output"


@pytest.mark.parametrize("kind, stderr, detail", [
    ("netem", TC_UNKNOWN_KIND, "kernel lacks sch_netem: 'Error: Specified qdisc kind is unknown.'"),
    ("red", TC_RED_OUTPUT, "kernel lacks sch_red: 'Error: Specified qdisc kind is unknown.'"),
    ("sfq", TC_OLD_KERNEL_UNKNOWN, "kernel lacks sch_sfq: 'RTNETLINK answers: No such file or directory'"),
    ("tbf", TC_BAD_ARGS, "tc refused it: 'Illegal \"burst\"'"),
    ("htb", "tc: No such file or directory", "tc refused it: 'tc: No such file or directory'"),
])
def test_qdisc_failure_detail(kind, stderr, detail):
    assert cap.qdisc_failure_detail(kind, stderr) == detail


def test_every_qdisc_kind_is_probed_and_only_htb_is_required():
    assert set(cap.QDISC_ARGS) == {"htb", "tbf", "netem", "sfq", "codel", "fq_codel", "fq", "red",
                                   "prio", "hfsc", "pfifo", "pfifo_head_drop", "bfifo"}
    assert [kind for kind in cap.QDISC_ARGS if cap._qdisc_capability(kind, True, "").required] == ["htb"]
    assert cap._qdisc_capability("netem", False, "").name == "netem"
    assert cap._qdisc_capability("tbf", True, "").probe == (
        "tc qdisc add dev <veth> root tbf rate 1mbit burst 32kbit latency 400ms")


def test_tcp_capabilities_from_available_list_and_modules_on_disk():
    module_dir = Path("/lib/modules/6.1.0-18-amd64/kernel/net/ipv4")
    caps = {c.name: c for c in cap.tcp_capabilities("reno bbr cubic".split(), module_dir, {"vegas"})}
    assert list(caps) == [f"tcp:{algorithm}" for algorithm in cap.STUDY_TCP]
    assert caps["tcp:bbr"].available and caps["tcp:bbr"].detail == "in tcp_available_congestion_control"
    assert caps["tcp:vegas"].available and "loads when a root process first selects it" in caps["tcp:vegas"].detail
    assert not caps["tcp:dctcp"].available
    assert caps["tcp:dctcp"].detail == f"not in tcp_available_congestion_control; no tcp_dctcp.ko* in {module_dir}"
    assert not any(c.required for c in caps.values())


@pytest.mark.parametrize("value, available, fragment", [
    (8388608, True, "enough"),
    (212992, False, "212992: below 8388608"),
    (None, False, "could not read"),
])
def test_wmem_capability(value, available, fragment):
    wmem = cap.wmem_capability(value)
    assert (wmem.available, wmem.required) == (available, False)
    assert fragment in wmem.detail


def test_run_turns_missing_programs_and_hangs_into_failed_results():
    assert cap._run(["no-such-program-qp"]).returncode == 127
    assert cap._run(["sleep", "5"], timeout=0.2).returncode == 124


def test_exit_code_is_one_only_when_a_required_capability_is_missing():
    assert cap.doctor_exit_code([make("ovs", True, required=True), make("netem", False)]) == 0
    assert cap.doctor_exit_code([make("ovs", False, required=True), make("netem", True)]) == 1
    assert cap.doctor_exit_code([]) == 0


def test_missing_lists_every_unavailable_name_in_order():
    caps = [make("netem", False), make("ovs", True, required=True), make("iperf3", False, required=True)]
    assert cap.missing(caps) == ["netem", "iperf3"]


def test_report_is_an_aligned_table_with_optional_notes_and_a_verdict():
    caps = [
        make("ovs", True, required=True, detail="Open vSwitch 3.1.0; ovsdb-server and ovs-vswitchd answer"),
        make("netem", False, detail="kernel lacks sch_netem: 'Error: Specified qdisc kind is unknown.' " * 2),
        make("qdisc:sfq", False), make("qdisc:red", False),
        make("tcp:vegas", False), make("tcp:bic", False),
    ]
    report = cap.doctor_report(caps)
    lines = report.splitlines()
    header = lines[0]
    assert header.split() == ["capability", "available", "detail", "how", "probed"]
    table = lines[:lines.index("* required by the main study")]
    for column in ("available", "detail", "how probed"):
        start = header.index(column)
        assert all(line[start - 2:start] in ("  ", "") for line in table), column  # gutters stay clear
    assert lines[2].startswith("ovs *") and lines[2][header.index("available"):].startswith("yes")
    assert any(line.startswith("netem ") and "no" in line for line in lines)
    assert "- netem missing: link delay and loss cannot be emulated; the study runs without the 5 ms delay." in lines
    assert "- qdisc:sfq, qdisc:red missing: the queue-discipline comparison leaves these out." in lines
    assert "- tcp:vegas, tcp:bic missing: the congestion-control comparison leaves these out." in lines
    assert lines[-1] == "The main study can run on this host."


def test_verdict_names_each_missing_required_capability():
    caps = [make("ovs", False, required=True), make("ovs:datapath", False, required=True),
            make("iperf3", True, required=True), make("netem", True)]
    report = cap.doctor_report(caps)
    assert report.splitlines()[-1] == "The main study cannot run: missing ovs, ovs:datapath."
    assert "Every optional capability is available." in report


def test_environment_summarises_the_probed_capabilities():
    caps = [make("ovs", True, required=True, detail="Open vSwitch 3.1.0; ovsdb-server and ovs-vswitchd answer"),
            make("ovs:datapath:netdev", True), make("ovs:datapath:system", False),
            make("ovs:datapath", True, required=True),
            make("qdisc:htb", True, required=True), make("netem", False), make("qdisc:fq", False)]
    env = cap.environment(caps)
    assert env["ovs_version"] == "3.1.0"
    assert env["datapath_types"] == ["netdev"]
    assert env["qdiscs"] == {"htb": True, "netem": False, "fq": False}
    assert env["netem"] is False
    assert env["missing"] == ["ovs:datapath:system", "netem", "qdisc:fq"]
    assert {"kernel", "python", "tcp_congestion_control"} <= set(env)
