"""A Mininet network of OVS switches under our controller, torn down whatever happens.

Everything started inside (iperf3 servers and clients) is registered with the network
and killed before the network stops, so an error or Ctrl-C leaves no process, bridge
or namespace behind.
"""
from __future__ import annotations

import subprocess
from contextlib import contextmanager
from functools import partial
from typing import Iterator

from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch, RemoteController


class Network:
    def __init__(self, net: Mininet):
        self.net = net
        self._procs: list[subprocess.Popen] = []

    def host(self, name: str):
        return self.net.get(name)

    def popen(self, host: str, args: list[str]) -> subprocess.Popen:
        proc = self.net.get(host).popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        self._procs.clear()


@contextmanager
def network(topo, datapath: str, controller_port: int = 6653) -> Iterator[Network]:
    """Start `topo` on OVS (`datapath` "user" or "kernel") with a remote controller on loopback."""
    setLogLevel("error")
    switch = partial(OVSSwitch, datapath=datapath, protocols="OpenFlow13", failMode="secure")
    controller = partial(RemoteController, ip="127.0.0.1", port=controller_port)
    net = Mininet(topo=topo, switch=switch, controller=controller, autoSetMacs=True, build=False)
    wrapped = Network(net)
    try:
        net.build()
        net.start()
        for host in net.hosts:
            for intf in host.intfList():
                # The userspace datapath never fills in TCP checksums left to offload (PLATFORM.md).
                host.cmd(f"ethtool -K {intf.name} tx off")
        yield wrapped
    finally:
        wrapped.kill_all()
        net.stop()
