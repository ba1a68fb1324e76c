"""What this host can emulate, found by trying it, and the `doctor` report.

Kernels differ (a build machine may lack netem, most AQM qdiscs and the OVS kernel
datapath), so the study probes instead of assuming, uses what exists and says once,
plainly, what it could not do. Probes run real commands; the parsing of their output
is kept in pure functions so it can be tested on captured text.

Run `python -m topo.harness.capabilities` (as root) for the report; exit status 1 means the
main study cannot run here.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Capability:
    name: str  # e.g. "netem", "qdisc:fq_codel", "tcp:bbr", "ovs:datapath:netdev"
    available: bool
    detail: str  # what was found: a version, or why it is unavailable
    probe: str  # how it was probed, as a command line
    required: bool  # the main study cannot run without it


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


# Minimal arguments each kind needs before tc sends it to the kernel; the unknown-kind
# error only comes back for a request tc could build.
QDISC_ARGS: dict[str, str] = {
    "htb": "",
    "tbf": "rate 1mbit burst 32kbit latency 400ms",
    "netem": "delay 1ms",
    "sfq": "",
    "codel": "",
    "fq_codel": "",
    "fq": "",
    # tc derives RED's averaging constant from burst, which must be >= (2*min + max) / (3*avpkt).
    "red": "limit 400000 min 30000 max 90000 avpkt 1000 burst 55 bandwidth 10mbit",
    "prio": "",
    "hfsc": "",
    "pfifo": "",
    "pfifo_head_drop": "",
    "bfifo": "",
}
STUDY_TCP = ("reno", "cubic", "bbr", "vegas", "westwood", "htcp", "illinois", "dctcp",
             "bic", "hybla", "scalable", "lp", "veno", "yeah", "highspeed")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's mininet is installed for this interpreter only
TCP_AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")
WMEM_NEEDED = 8388608  # docs/datapath.md: smaller send buffers let one full queue stall every port
OVS_TIMEOUT = 5
OVS_START_HINT = ("if it is not running, start it: `systemctl start openvswitch-switch`, or "
                  "without systemd `/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random`")

# What the absence of each optional capability (or family of them) means for the study.
OPTIONAL_CONSEQUENCES = {
    "netem": "link delay and loss cannot be emulated; the study runs without the 5 ms delay",
    "qdisc": "the queue-discipline comparison leaves these out",
    "qdisc:hfsc": ("a policy port with qos_type linux-hfsc gets no queues (OVS cannot build them; the controller "
                   "shows the port as not in sync); use linux-htb"),
    "tcp": "the congestion-control comparison leaves these out",
    "ovs:datapath:netdev": "bridges must use the kernel datapath (datapath_type=system)",
    "ovs:datapath:system": ("bridges use the userspace datapath (datapath_type=netdev): host "
                            "interfaces need `ethtool -K <intf> tx off`, and queues are chosen "
                            "by DSCP marks plus tc filters instead of set_queue alone"),
    "prometheus": "no local Prometheus can scrape the controller's metrics",
    "promtool": "Prometheus rules and dashboard queries cannot be checked",
    "sysctl:net.core.wmem_default": (f"below {WMEM_NEEDED}, one full queue can stall every port of "
                                     f"a userspace bridge; run `sysctl -w net.core.wmem_default="
                                     f"{WMEM_NEEDED}` before ovs-vswitchd starts"),
}

_VERSION = re.compile(r"\d+(?:\.\d+)+(?:[-+~][\w.+~-]*)?")  # 3.12, 3.1.0, 2.42.0+ds
_OVS_LOG_PREFIX = re.compile(r"^\S+\|\d+\|\S+\|[A-Z]+\|")
_UNKNOWN_QDISC = ("qdisc kind is unknown", "RTNETLINK answers: No such file or directory")  # new, old
_WRAP_AT = (32, 9, 52, 50)  # column widths at which cells wrap, so the table fits ~150 columns


# --- pure parsing -------------------------------------------------------------------------

def parse_version(text: str) -> str | None:
    """The first version number in a tool's `--version` output, e.g. "3.1.0"."""
    found = _VERSION.search(text)
    return found.group(0) if found else None


def parse_ovsdb_set(text: str) -> list[str]:
    """`ovs-vsctl get` output such as "[netdev, system]" as a list."""
    return [item.strip().strip('"') for item in text.strip().strip("[]").split(",") if item.strip()]


def telling_line(text: str) -> str:
    """The line of a command's output worth quoting: its "Error:" line, else its first line,
    without OVS's log prefix."""
    lines = [_OVS_LOG_PREFIX.sub("", line).strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    return (errors or lines or ["no output"])[0]


def qdisc_failure_detail(kind: str, stderr: str) -> str:
    line = telling_line(stderr)
    if any(marker in line for marker in _UNKNOWN_QDISC):
        return f"kernel lacks sch_{kind}: '{line}'"
    return f"tc refused it: '{line}'"


def tcp_capabilities(available: list[str], module_dir: Path, loadable: set[str]) -> list[Capability]:
    """One capability per study algorithm; a module on disk counts, as Linux loads it on first use."""
    caps = []
    for algorithm in STUDY_TCP:
        if algorithm in available:
            detail = "in tcp_available_congestion_control"
        elif algorithm in loadable:
            detail = f"tcp_{algorithm}.ko* in {module_dir}: loads when a root process first selects it"
        else:
            detail = f"not in tcp_available_congestion_control; no tcp_{algorithm}.ko* in {module_dir}"
        caps.append(Capability(f"tcp:{algorithm}", algorithm in available or algorithm in loadable,
                               detail, f"grep -w {algorithm} {TCP_AVAILABLE}", required=False))
    return caps


def wmem_capability(value: int | None) -> Capability:
    if value is None:
        detail = f"could not read {WMEM_DEFAULT}"
    elif value >= WMEM_NEEDED:
        detail = f"{value}: enough for the userspace datapath (>= {WMEM_NEEDED})"
    else:
        detail = f"{value}: below {WMEM_NEEDED}, needed before ovs-vswitchd starts (userspace datapath)"
    return Capability("sysctl:net.core.wmem_default", value is not None and value >= WMEM_NEEDED,
                      detail, f"cat {WMEM_DEFAULT}", required=False)


# --- probes -------------------------------------------------------------------------------

def _run(argv: list[str], timeout: float = 10) -> CommandResult:
    """Run a command; a missing program or a hang becomes a failed result, never an exception."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"{argv[0]}: no answer within {timeout} s")
    except OSError as error:
        return CommandResult(127, "", f"{argv[0]}: {error.strerror or error}")
    return CommandResult(done.returncode, done.stdout, done.stderr)


def _why(result: CommandResult) -> str:
    return telling_line(result.stderr or result.stdout)


def _tool(name: str, argv: list[str], required: bool) -> Capability:
    result = _run(argv)
    probe = " ".join(argv)
    if result.returncode != 0:
        return Capability(name, False, _why(result), probe, required)
    output = result.stdout + result.stderr
    version = parse_version(output)
    return Capability(name, True, f"version {version}" if version else telling_line(output),
                      probe, required)


def _mininet() -> Capability:
    imported = _run([SYSTEM_PYTHON, "-c", "from mininet.net import VERSION; print(VERSION)"])
    mnexec = shutil.which("mnexec")
    if imported.returncode != 0:
        detail = f"{SYSTEM_PYTHON} cannot import mininet: {_why(imported)}"
    elif mnexec is None:
        detail = "mnexec is not on PATH"
    else:
        detail = f"version {imported.stdout.strip()}, mnexec at {mnexec}"
    return Capability("mininet", imported.returncode == 0 and mnexec is not None, detail,
                      f"{SYSTEM_PYTHON} -c 'from mininet.net import VERSION'; which mnexec",
                      required=True)


def _kernel_datapath() -> tuple[bool, str]:
    # Adding a system bridge would prove it but changes the switch; the module is what it needs.
    if Path("/sys/module/openvswitch").is_dir():
        return True, "kernel module openvswitch loaded (/sys/module/openvswitch)"
    # A built-in datapath has no /sys/module entry; its Generic Netlink family still answers.
    dpctl = _run(["ovs-dpctl", "show"])
    if dpctl.returncode == 0:
        return True, "kernel datapath answers `ovs-dpctl show` (built in)"
    return False, f"kernel lacks the OVS datapath: no /sys/module/openvswitch; ovs-dpctl: {_why(dpctl)}"


def _ovs_service() -> Capability:
    installed = _run(["ovs-vsctl", "--version"])
    database = _run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT}", "show"])
    switchd = _run(["ovs-appctl", f"--timeout={OVS_TIMEOUT}", "version"])
    running = installed.returncode == database.returncode == switchd.returncode == 0
    version = f"Open vSwitch {parse_version(installed.stdout)}"
    if running:
        detail = f"{version}; ovsdb-server and ovs-vswitchd answer"
    elif installed.returncode != 0:
        detail = f"not installed: {_why(installed)}"
    elif database.returncode != 0:
        detail = f"{version}, but ovsdb-server cannot be reached: {_why(database)}; {OVS_START_HINT}"
    else:
        detail = f"{version}, but ovs-vswitchd cannot be reached: {_why(switchd)}; {OVS_START_HINT}"
    return Capability("ovs", running, detail,
                      "ovs-vsctl --version; ovs-vsctl show; ovs-appctl version", required=True)


def _ovs_datapaths(ovs_running: bool) -> list[Capability]:
    types = _run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT}", "get", "Open_vSwitch", ".", "datapath_types"])
    listed = parse_ovsdb_set(types.stdout) if types.returncode == 0 else []
    if not ovs_running:
        netdev_detail = "needs a running Open vSwitch (see ovs)"
    elif types.returncode != 0:
        netdev_detail = _why(types)
    else:
        netdev_detail = f"datapath_types: {', '.join(listed)}"
    netdev = Capability("ovs:datapath:netdev", ovs_running and "netdev" in listed, netdev_detail,
                        "ovs-vsctl get Open_vSwitch . datapath_types", required=False)
    kernel_ok, kernel_detail = _kernel_datapath()
    system = Capability("ovs:datapath:system", kernel_ok, kernel_detail,
                        "test -d /sys/module/openvswitch || ovs-dpctl show", required=False)
    usable = [cap.name.rsplit(":", 1)[1] for cap in (netdev, system) if cap.available]
    either = Capability("ovs:datapath", bool(usable),
                        f"usable: {', '.join(usable)}" if usable else "no usable datapath",
                        "ovs:datapath:netdev or ovs:datapath:system", required=True)
    return [netdev, system, either]


def _qdisc_name(kind: str) -> str:
    return "netem" if kind == "netem" else f"qdisc:{kind}"


def _qdisc_capability(kind: str, available: bool, detail: str) -> Capability:
    probe = f"tc qdisc add dev <veth> root {kind} {QDISC_ARGS[kind]}".rstrip()
    return Capability(_qdisc_name(kind), available, detail, probe, required=kind == "htb")


def _try_qdisc(dev: str, kind: str) -> Capability:
    added = _run(["tc", "qdisc", "add", "dev", dev, "root", kind, *QDISC_ARGS[kind].split()])
    if added.returncode != 0:
        return _qdisc_capability(kind, False, qdisc_failure_detail(kind, added.stderr or added.stdout))
    _run(["tc", "qdisc", "del", "dev", dev, "root"])
    return _qdisc_capability(kind, True, "added and removed on a probe veth")


def _unused_link_name() -> str:
    while True:
        name = "qp" + secrets.token_hex(3)
        if not Path("/sys/class/net", name).exists():
            return name


def _delete_link(name: str, wait: float = 2.0) -> None:
    """Delete a link (for a veth, both ends) and wait until it is gone, so that callers
    checking the host right after a probe find it as it was."""
    if Path("/sys/class/net", name).exists():
        _run(["ip", "link", "del", name])
    deadline = time.monotonic() + wait
    while Path("/sys/class/net", name).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@functools.cache
def _qdisc_capabilities() -> dict[str, Capability]:
    """Try every kind on one throwaway veth pair; cached, as a kernel's qdiscs do not change."""
    veth = _unused_link_name()
    try:
        created = _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "p"])
        if created.returncode != 0:
            reason = f"not probed: cannot create a veth pair: {_why(created)}"
            return {kind: _qdisc_capability(kind, False, reason) for kind in QDISC_ARGS}
        return {kind: _try_qdisc(veth, kind) for kind in QDISC_ARGS}
    finally:
        _delete_link(veth)


def _tcp_module_dir() -> Path:
    return Path("/lib/modules", platform.release(), "kernel", "net", "ipv4")


def _loadable_tcp_modules(module_dir: Path) -> set[str]:
    return {path.name.split(".ko")[0].removeprefix("tcp_") for path in module_dir.glob("tcp_*.ko*")}


def _wmem_default() -> int | None:
    try:
        return int(WMEM_DEFAULT.read_text())
    except (OSError, ValueError):
        return None


def tcp_algorithms() -> list[str]:
    try:
        return TCP_AVAILABLE.read_text().split()
    except OSError:
        return []


def qdisc_available(kind: str) -> bool:
    """Whether the kernel takes a root qdisc of this kind (one of QDISC_ARGS)."""
    return _qdisc_capabilities()[kind].available


def netem_available() -> bool:
    return qdisc_available("netem")


def probe_all() -> list[Capability]:
    ovs = _ovs_service()
    module_dir = _tcp_module_dir()
    return [
        ovs,
        *_ovs_datapaths(ovs.available),
        _mininet(),
        _tool("iperf3", ["iperf3", "--version"], required=True),
        _tool("ethtool", ["ethtool", "--version"], required=True),
        *_qdisc_capabilities().values(),
        *tcp_capabilities(tcp_algorithms(), module_dir, _loadable_tcp_modules(module_dir)),
        _tool("prometheus", ["prometheus", "--version"], required=False),
        _tool("promtool", ["promtool", "--version"], required=False),
        wmem_capability(_wmem_default()),
    ]


# --- results metadata and the report ------------------------------------------------------

def missing(caps: list[Capability]) -> list[str]:
    return [cap.name for cap in caps if not cap.available]


def environment(caps: list[Capability]) -> dict[str, Any]:
    by_name = {cap.name: cap for cap in caps}
    ovs = by_name.get("ovs")
    return {
        "kernel": platform.release(),
        "ovs_version": parse_version(ovs.detail) if ovs else None,
        "datapath_types": [cap.name.rsplit(":", 1)[1] for cap in caps
                           if cap.name.startswith("ovs:datapath:") and cap.available],
        "tcp_congestion_control": tcp_algorithms(),
        "qdiscs": {kind: by_name[_qdisc_name(kind)].available
                   for kind in QDISC_ARGS if _qdisc_name(kind) in by_name},
        "netem": "netem" in by_name and by_name["netem"].available,
        "missing": missing(caps),
        "python": platform.python_version(),
    }


def _family(name: str) -> str:
    """Group qdiscs and TCP algorithms so each family's absence is explained once (but a member
    with a consequence of its own is explained apart)."""
    prefix = name.split(":", 1)[0]
    return prefix if prefix in ("qdisc", "tcp") and name not in OPTIONAL_CONSEQUENCES else name


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    wrapped = [[textwrap.wrap(cell, width, break_long_words=False, break_on_hyphens=False) or [""]
                for cell, width in zip(row, _WRAP_AT)] for row in rows]
    widths = [max(len(line) for row in wrapped for line in row[column]) for column in range(4)]
    lines = []
    for row in wrapped:
        for parts in itertools.zip_longest(*row, fillvalue=""):
            lines.append("  ".join(part.ljust(width) for part, width in zip(parts, widths)).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _optional_notes(caps: list[Capability]) -> list[str]:
    families: dict[str, list[str]] = {}
    for cap in caps:
        if not cap.available and not cap.required:
            families.setdefault(_family(cap.name), []).append(cap.name)
    if not families:
        return ["Every optional capability is available."]
    return ["Optional capabilities missing here, and what that means:"] + [
        textwrap.fill(f"{', '.join(names)} missing: {OPTIONAL_CONSEQUENCES[family]}.", 100,
                      initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)
        for family, names in families.items()]


def unavailable(caps: dict[str, Capability], names: list[str], family: str) -> dict[str, str]:
    """name → why this host lacks it, for each name whose `family:name` capability is missing."""
    reasons = {}
    for name in names:
        cap = caps.get(f"{family}:{name}")
        if not (cap and cap.available):
            reasons[name] = cap.detail if cap else f"not probed: {family} {name} is unknown to this host"
    return reasons


def choose_tcp(requested: list[str] | None, kernel: list[str],
               caps: dict[str, Capability]) -> tuple[list[str], dict[str, str]]:
    """(algorithms to run, skipped → why) of `requested`, default every one the kernel offers: its
    own list (`kernel`) plus the study's algorithms it loads on first use."""
    offered = kernel + [a for a in STUDY_TCP if a not in kernel and not unavailable(caps, [a], "tcp")]
    wanted = requested or list(dict.fromkeys([*STUDY_TCP, *offered]))
    return [a for a in wanted if a in offered], unavailable(caps, [a for a in wanted if a not in offered], "tcp")


def verdict(caps: list[Capability]) -> str:
    lacking = [cap.name for cap in caps if cap.required and not cap.available]
    if lacking:
        return f"The main study cannot run: missing {', '.join(lacking)}."
    return "The main study can run on this host."


def doctor_report(caps: list[Capability]) -> str:
    rows = [("capability", "available", "detail", "how probed")] + [
        (cap.name + (" *" if cap.required else ""), "yes" if cap.available else "no",
         cap.detail, cap.probe) for cap in caps]
    return "\n".join([_table(rows), "* required by the main study", "",
                      *_optional_notes(caps), "", verdict(caps)])


def doctor_exit_code(caps: list[Capability]) -> int:
    return 1 if any(cap.required and not cap.available for cap in caps) else 0


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m topo.harness.capabilities",
                            description="Probe what this host can emulate (run as root) and "
                                        "print the doctor report; exit 1 if the main study "
                                        "cannot run here.").parse_args(argv)
    if os.geteuid() != 0:
        print("Not running as root: qdisc probes and OVS need root, so this report understates "
              "the host.\n", file=sys.stderr)
    caps = probe_all()
    print(doctor_report(caps))
    return doctor_exit_code(caps)


if __name__ == "__main__":
    sys.exit(main())
