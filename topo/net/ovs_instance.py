"""A second, independent Open vSwitch on this machine, as a second OVS host would be: its own database
file, run directory, sockets, ovsdb-server (on a unix socket and on TCP or SSL at its own loopback
address, e.g. 127.0.0.2:6640), and its ovs-vswitchd in a network namespace of its own, joined to this
one by a management veth. Started and stopped here; nothing is left behind.

The namespace is not optional: the userspace datapath's backer is a tap device named ovs-netdev, and
two vswitchds with netdev bridges in one namespace cannot both have it (the second fails with EBUSY,
"datapath ovs-netdev already exists but cannot be opened"; OVS 3.1). Its switches reach the controller
at CONTROLLER_ADDRESS over the management veth; a port of one of its bridges is moved into the
namespace before it is added. `OVS_RUNDIR` points OVS's tools and the bridges' sockets at its run
directory, so the system's OVS is never touched.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mininet.node import OVSSwitch
from mininet.util import errRun

from topo.net.processes import Recorder, end

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
CONTROLLER_ADDRESS = "169.254.72.1"    # this side of the management veth: where the controller listens
INSTANCE_ADDRESS = "169.254.72.2"
BASE = Path("/run/ovs-qos-instances")
START_SECONDS = 20


class InstanceError(RuntimeError):
    """The instance's daemons did not start."""


@dataclass(frozen=True)
class Pki:
    """A private key, its certificate and the CA that signed the peers' (ovs-pki's layout)."""
    private_key: Path
    certificate: Path
    ca_cert: Path


@dataclass
class OvsInstance:
    name: str
    rundir: Path
    address: str
    port: int
    pki: Pki | None = None
    record: Recorder | None = None
    ovsdb_server: subprocess.Popen | None = None
    vswitchd: subprocess.Popen | None = None

    @property
    def remote(self) -> str:
        """How a controller reaches its OVSDB: tcp:ADDR:PORT, or ssl:ADDR:PORT."""
        return f"{'ssl' if self.pki else 'tcp'}:{self.address}:{self.port}"

    @property
    def unix(self) -> str:
        return f"unix:{self.rundir / 'db.sock'}"

    @property
    def netns(self) -> str:
        return _netns(self.name)

    def move(self, iface: str) -> None:
        """A device of this namespace into the instance's, up, to be a port of one of its bridges."""
        _run(["ip", "link", "set", iface, "netns", self.netns], self.env)
        _run(["ip", "-n", self.netns, "link", "set", iface, "up"], self.env)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "OVS_RUNDIR": str(self.rundir)}

    def vsctl(self, *args: str) -> str:
        return _run(["ovs-vsctl", f"--db={self.unix}", "--timeout=30", *args], self.env)

    def ofctl(self, *args: str) -> str:
        return _run(["ovs-ofctl", *args], self.env)

    def start_ovsdb(self) -> None:
        """ovsdb-server on its database file, on its unix socket and its TCP (or SSL) address."""
        ssl = [f"--private-key={self.pki.private_key}", f"--certificate={self.pki.certificate}",
               f"--ca-cert={self.pki.ca_cert}"] if self.pki else []
        (self.rundir / "db.sock").unlink(missing_ok=True)
        self.ovsdb_server = self._daemon(
            ["ovsdb-server", str(self.rundir / "conf.db"), f"--remote=punix:{self.rundir / 'db.sock'}",
             f"--remote=p{self.remote.split(':', 1)[0]}:{self.port}:{self.address}", *ssl,
             f"--unixctl={self.rundir / 'ovsdb-server.ctl'}", f"--pidfile={self.rundir / 'ovsdb-server.pid'}",
             f"--log-file={self.rundir / 'ovsdb-server.log'}"])
        _wait(lambda: (self.rundir / "db.sock").exists(), "ovsdb-server", self.rundir)

    def stop_ovsdb(self) -> None:
        """Its ovsdb-server gone, as a host's would be; the database file stays."""
        end(self.ovsdb_server, 10)
        self.ovsdb_server = None

    def start_vswitchd(self) -> None:
        self.vswitchd = self._daemon(["ip", "netns", "exec", self.netns, "ovs-vswitchd", self.unix,
                                      f"--unixctl={self.rundir / 'ovs-vswitchd.ctl'}",
                                      f"--pidfile={self.rundir / 'ovs-vswitchd.pid'}",
                                      f"--log-file={self.rundir / 'ovs-vswitchd.log'}"])
        _wait(lambda: (self.rundir / "ovs-vswitchd.ctl").exists(), "ovs-vswitchd", self.rundir)
        self.vsctl("init")                          # returns once vswitchd has read the database

    def _daemon(self, args: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(args, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        if self.record:
            self.record.process(proc.pid, args[0])
        return proc


@contextmanager
def ovs_instance(name: str = "ovs2", address: str = "127.0.0.2", port: int = 6640, pki: Pki | None = None,
                 record: Recorder | None = None) -> Iterator[OvsInstance]:
    """The instance up, its OVSDB listening on `address`:`port` (SSL when `pki` is given, with the same
    key and certificate for OpenFlow's connections to controllers); stopped and removed afterwards."""
    rundir = BASE / name
    stop(rundir)                                    # what a killed run left
    rundir.mkdir(parents=True)
    instance = OvsInstance(name, rundir, address, port, pki, record)
    try:
        ns, here, there = instance.netns, *_management_veth(name)
        for args in (["netns", "add", ns], ["-n", ns, "link", "set", "lo", "up"],
                     ["link", "add", here, "type", "veth", "peer", "name", there, "netns", ns],
                     ["addr", "add", f"{CONTROLLER_ADDRESS}/30", "dev", here], ["link", "set", here, "up"],
                     ["-n", ns, "addr", "add", f"{INSTANCE_ADDRESS}/30", "dev", there],
                     ["-n", ns, "link", "set", there, "up"]):
            _run(["ip", *args], instance.env)
        _run(["ovsdb-tool", "create", str(rundir / "conf.db"), str(SCHEMA)], instance.env)
        instance.start_ovsdb()
        instance.vsctl("--no-wait", "init")
        if pki:
            instance.vsctl("--no-wait", "set-ssl", str(pki.private_key), str(pki.certificate), str(pki.ca_cert))
        instance.start_vswitchd()
        yield instance
    finally:
        stop(rundir)
        end(instance.vswitchd, 10)
        end(instance.ovsdb_server, 10)


def switch_on(instance: OvsInstance) -> type:
    """Mininet's OVSSwitch with every ovs-vsctl and ovs-ofctl it runs pointed at `instance`."""
    db, env = f"--db={instance.unix}", f"OVS_RUNDIR={instance.rundir}"

    class InstanceSwitch(OVSSwitch):
        def start(self, controllers):
            for intf in self.intfList():
                if intf.name != "lo":
                    instance.move(intf.name)
            super().start(controllers)
            # Its controller is reached over the management veth, whatever Mininet was told.
            self.vsctl("set-controller", self, *(f"tcp:{CONTROLLER_ADDRESS}:{c.port}" for c in controllers))

        def vsctl(self, *args, **kwargs):
            return self.cmd(env, "ovs-vsctl", db, *args, **kwargs)

        def dpctl(self, *args):
            return self.cmd(env, "ovs-ofctl", args[0], self, *args[1:])

        @classmethod
        def batchStartup(cls, switches, run=errRun):
            return switches   # each started itself (not batched: Mininet batches only a class it is given)

        @classmethod
        def batchShutdown(cls, switches, run=errRun):
            run(["ovs-vsctl", db, *(a for s in switches for a in ("--", "--if-exists", "del-br", s.name))])
            for switch in switches:
                switch.terminate()
            return switches

    return InstanceSwitch


def stop(rundir: Path) -> None:
    """Its bridges and their devices removed, both daemons ended, its files gone. The bridges are deleted
    while vswitchd runs: the userspace datapath's tap devices outlive an `exit --cleanup` (measured: 3.1)."""
    db = f"--db=unix:{rundir / 'db.sock'}"
    if (rundir / "ovs-vswitchd.ctl").exists() and (rundir / "db.sock").exists():
        bridges = subprocess.run(["ovs-vsctl", db, "--timeout=10", "list-br"], capture_output=True, text=True).stdout
        deletes = [a for bridge in bridges.split() for a in ("--", "--if-exists", "del-br", bridge)]
        if deletes:
            subprocess.run(["ovs-vsctl", db, "--timeout=30", *deletes], capture_output=True)
    if (rundir / "ovs-vswitchd.ctl").exists():
        subprocess.run(["ovs-appctl", "-t", str(rundir / "ovs-vswitchd.ctl"), "exit", "--cleanup"],
                       capture_output=True, timeout=30)
    for pidfile in ("ovs-vswitchd.pid", "ovsdb-server.pid"):
        try:
            os.kill(int((rundir / pidfile).read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    subprocess.run(["ip", "link", "del", _management_veth(rundir.name)[0]], capture_output=True)
    subprocess.run(["ip", "netns", "del", _netns(rundir.name)], capture_output=True)   # its devices go with it
    shutil.rmtree(rundir, ignore_errors=True)


def stop_all() -> list[str]:
    """Every instance a killed run left, stopped and removed; what was removed."""
    left = sorted(BASE.glob("*")) if BASE.is_dir() else []
    for rundir in left:
        stop(rundir)
    return [f"OVS instance {rundir.name}" for rundir in left]


def _netns(name: str) -> str:
    return f"ovsqos-{name}"


def _management_veth(name: str) -> tuple[str, str]:
    """The management veth's ends: in this namespace, and in the instance's."""
    return f"{name}-m0", f"{name}-m1"


def _wait(ready, what: str, rundir: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not ready():
        if time.monotonic() > deadline:
            raise InstanceError(f"{what} of the instance in {rundir} did not start within {START_SECONDS} s; see "
                                f"{rundir / (what + '.log')}")
        time.sleep(0.1)


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise InstanceError(f"{' '.join(args[:3])}: {done.stderr.strip()}")
    return done.stdout
