"""A Mininet network of OVS switches under our controller, torn down whatever happens.

Every process started in a host writes to a file, never to a pipe: nobody reads a pipe until the
process exits, and iperf3's JSON of a long test outgrows the pipe's 64 KiB, so the child blocked
in write() forever (the README's default run hung that way). Processes are registered with the
network, which kills them before it stops, and with the run record, so that the next launcher
removes them if this one is killed.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch, RemoteController

from topo.net.ovs_instance import CONTROLLER_ADDRESS, OvsInstance, switch_on
from topo.net.processes import Recorder


class Network:
    def __init__(self, net: Mininet, record: Recorder | None):
        self.net = net
        self._record = record
        self._procs: list[subprocess.Popen] = []

    def host(self, name: str):
        return self.net.get(name)

    def popen(self, host: str, args: list[str], out: Path) -> subprocess.Popen:
        """Start `args` in `host` with stdout to `out` and stderr to `out`.stderr."""
        with open(out, "w") as stdout, open(out.with_name(out.name + ".stderr"), "w") as stderr:
            proc = self.net.get(host).popen(args, stdout=stdout, stderr=stderr)
        self._procs.append(proc)
        if self._record:
            self._record.process(proc.pid, args[0])
        return proc

    def link_state(self, a: str, b: str, up: bool) -> None:
        """The link between nodes `a` and `b` down or up at both its ends (Mininet's `link a b down`)."""
        self.net.configLinkStatus(a, b, "up" if up else "down")

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._procs.clear()


class UncheckedRemote(RemoteController):
    """Mininet's remote controller without its start-up check. The check runs `telnet` to the port in a
    shell and decodes what telnet prints as UTF-8; the controller greets with a binary OpenFlow hello, and
    once (a loaded CI host) that reached telnet's output before telnet quit: Mininet's UnicodeDecodeError
    ended the launcher. Whoever builds a network waits for the controller to report its switches instead
    (topo/studies/base.py)."""

    def checkListening(self) -> None:
        pass


@contextmanager
def network(topo, datapath: str, record: Recorder | None = None, controller_ports: tuple[int, ...] = (6653,),
            placed: dict[str, OvsInstance] | None = None) -> Iterator[Network]:
    """Start `topo` on OVS (`datapath` "user" or "kernel") with a remote controller on loopback at each of
    `controller_ports` (a cluster's members: every switch is pointed at all of them); the switches named in
    `placed` on that OVS instance (topo/net/ovs_instance.py), the rest on the system's."""
    setLogLevel("error")
    options = {"datapath": datapath, "protocols": "OpenFlow13", "failMode": "secure"}
    switch = partial(OVSSwitch, **options)
    for name, instance in (placed or {}).items():
        topo.nodeInfo(name)["cls"] = partial(switch_on(instance), **options)
    # With switches on another OVS the controller listens where that OVS's namespace reaches it.
    controllers = [partial(UncheckedRemote, ip=CONTROLLER_ADDRESS if placed else "127.0.0.1", port=port)
                   for port in controller_ports]
    net = Mininet(topo=topo, switch=switch, controller=controllers, autoSetMacs=True, build=False)
    wrapped = Network(net, record)
    try:
        if record:
            record.network(bridges=list(topo.switches()), links=[], hosts={})
        net.build()
        if record:
            record.network(bridges=[], hosts={h.name: h.pid for h in net.hosts},
                           links=[i.name for s in net.switches for i in s.intfList() if i.name != "lo"])
        net.start()
        _wait_for_ofports(net.switches)
        # Every host knows every other's MAC: the policies forward unicast only (no flow floods ARP).
        net.staticArp()
        for host in net.hosts:
            for intf in host.intfList():
                # The userspace datapath never fills in TCP checksums left to offload (docs/datapath.md).
                host.cmd(f"ethtool -K {intf.name} tx off")
        yield wrapped
    finally:
        wrapped.kill_all()
        net.stop()


def _wait_for_ofports(switches, timeout: float = 20.0) -> None:
    """Every switch port has its OpenFlow number before anyone names it in a policy. The switches can
    be connected to the controller while a port is not: OVS leaves ofport at -1 when it could not
    open the device at that moment, and opens it at its next reconfiguration (a link change wakes
    it). A port still without a number after `timeout` stops the run with OVS's own reason."""
    deadline = time.monotonic() + timeout
    for switch in switches:
        for intf in switch.intfList():
            if intf.name == "lo":
                continue
            while (ofport := switch.vsctl("get", "Interface", intf.name, "ofport").strip()) in ("[]", "-1", ""):
                if time.monotonic() > deadline:
                    error = switch.vsctl("get", "Interface", intf.name, "error").strip()
                    raise RuntimeError(f"OVS gave {switch.name}'s port {intf.name} no OpenFlow number in "
                                       f"{timeout:.0f} s (ofport {ofport or '[]'}, error {error})")
                time.sleep(0.1)
