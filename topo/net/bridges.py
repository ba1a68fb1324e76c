"""Bridges with many ports and no hosts, for scale: the benchmarks' (bench/scale.py, bench/cluster.py) and
the main study's --idle-ports. Userspace bridges (datapath_type=netdev) of OVS internal ports, OpenFlow
1.3, secure fail mode, each with its own datapath id, pointed at the controller(s); recorded first (so a
killed run's are removed too), created and removed BATCH_PORTS ports of whole bridges per OVSDB
transaction, each with its own timeout, however the caller ends.

What it costs (250 bridges of 20 ports, OVS 3.1):
- The rows are made with ovs-vsctl's generic `create` commands that name each other by `@id`, not with
  `add-port BR IFACE -- set interface IFACE ...`: `set` finds its row by name with a scan of the whole
  Interface table (db-ctl-base's get_row_by_id), 5000 scans of up to 5250 rows in ovs-vsctl itself:
  51 s of its CPU in one transaction, 44 s in batches of 10 bridges (the scan covers the bridges made
  before), against 0.4 s with `create`.
- vswitchd reconfigures every port of the host for each transaction (coverage/show: two
  bridge_reconfigure and a netdev_set_policing per interface each), so fewer transactions are cheaper:
  28.6 s in one, 39.4 s in five of 1000 ports (the last one 15.5 s).
- Removing is slower: 210 s in ten transactions of 25 bridges, vswitchd's main thread 59 % on the CPU
  (the same reconfiguration) and 39 % in close() of a tap device, waiting in the kernel's rcu_barrier
  (/proc/PID/task/PID/wchan).
"""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from topo.net.processes import Recorder

BATCH_PORTS = 2500          # ports per OVSDB transaction (whole bridges; one bridge may be bigger)
TRANSACTION_SECONDS = 300   # each transaction's timeout, vswitchd's reconfiguration included


class BridgeError(RuntimeError):
    """A transaction that makes or removes bridges failed; the message is one line."""


@dataclass(frozen=True)
class IdleBridge:
    name: str
    dp_id: int
    ports: tuple[int, ...]          # OpenFlow port numbers, 1..N


def plan(total_ports: int, per_bridge: int, prefix: str = "idle", first_dp_id: int = 0x1000) -> list[IdleBridge]:
    """`total_ports` ports on bridges of at most `per_bridge` ports each."""
    return [IdleBridge(f"{prefix}{k}", first_dp_id + k, tuple(range(1, min(per_bridge, total_ports - start) + 1)))
            for k, start in enumerate(range(0, total_ports, per_bridge))]


def batches(bridges: list[IdleBridge], batch_ports: int = BATCH_PORTS) -> list[list[IdleBridge]]:
    """Whole bridges, in order, at most `batch_ports` ports a batch (at least one bridge)."""
    out: list[list[IdleBridge]] = []
    count = 0
    for bridge in bridges:
        if out and count + len(bridge.ports) <= batch_ports:
            out[-1].append(bridge)
            count += len(bridge.ports)
        else:
            out.append([bridge])
            count = len(bridge.ports)
    return out


def create_commands(bridges: list[IdleBridge], controllers: Sequence[str]) -> list[str]:
    """ovs-vsctl's commands (after its options) for one transaction that makes `bridges`: rows created
    and linked by @id, never looked up by name."""
    args: list[str] = []
    for bridge in bridges:
        n = bridge.name
        targets = []
        for k, target in enumerate(controllers):
            args += ["--", f"--id=@{n}.c{k}", "create", "controller", f'target="{target}"']
            targets.append(f"@{n}.c{k}")
        ports = []
        for port in (0, *bridge.ports):         # 0: the bridge's own local port, named after it
            iface = n if port == 0 else f"{n}p{port}"
            args += ["--", f"--id=@{iface}.i", "create", "interface", f"name={iface}", "type=internal",
                     *([f"ofport_request={port}"] if port else []),
                     "--", f"--id=@{iface}.p", "create", "port", f"name={iface}", f"interfaces=@{iface}.i"]
            ports.append(f"@{iface}.p")
        args += ["--", f"--id=@{n}.b", "create", "bridge", f"name={n}", "datapath_type=netdev",
                 "protocols=OpenFlow13", "fail_mode=secure", f"other_config:datapath-id={bridge.dp_id:016x}",
                 f"controller=[{','.join(targets)}]", f"ports=[{','.join(ports)}]",
                 "--", "add", "open_vswitch", ".", "bridges", f"@{n}.b"]
    return args


def delete_commands(names: Sequence[str]) -> list[str]:
    return [a for name in names for a in ("--", "--if-exists", "del-br", name)]


def vsctl(commands: list[str], what: str, seconds: float = TRANSACTION_SECONDS) -> None:
    """One ovs-vsctl transaction (waiting for vswitchd to apply it); BridgeError, in one line, if it fails."""
    try:
        done = subprocess.run(["ovs-vsctl", f"--timeout={seconds:g}", *commands], capture_output=True, text=True,
                              timeout=seconds + 10)
    except subprocess.TimeoutExpired:
        raise BridgeError(f"{what}: ovs-vsctl did not return within {seconds + 10:g} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise BridgeError(f"{what}: ovs-vsctl exited with {done.returncode}"
                          + (f" ({lines[-1][:300]})" if lines else ""))


def existing(names: Sequence[str]) -> list[str]:
    done = subprocess.run(["ovs-vsctl", "--timeout=30", "list-br"], capture_output=True, text=True)
    if done.returncode != 0:
        raise BridgeError(f"ovs-vsctl list-br exited with {done.returncode} ({done.stderr.strip()[:300]})")
    present = set(done.stdout.split())
    return [name for name in names if name in present]


def remove(bridges: Sequence[IdleBridge], batch_ports: int = BATCH_PORTS) -> None:
    """Delete the bridges, a batch a transaction; the first failure raised after trying every batch."""
    failed: BridgeError | None = None
    for batch in batches(list(bridges), batch_ports):
        try:
            vsctl(delete_commands([b.name for b in batch]), f"removing bridges {batch[0].name}..{batch[-1].name}")
        except BridgeError as err:
            failed = failed or err
    if failed:
        raise failed


@contextmanager
def idle_bridges(total_ports: int, per_bridge: int, prefix: str = "idle", first_dp_id: int = 0x1000,
                 controller: str | Sequence[str] = "tcp:127.0.0.1:6653", record: Recorder | None = None,
                 batch_ports: int = BATCH_PORTS) -> Iterator[list[IdleBridge]]:
    """`total_ports` ports on bridges of at most `per_bridge` ports each, pointed at `controller` (one
    target, or several: a cluster's members). A bridge of these names already there (a killed run's
    that no record listed) is replaced."""
    bridges = plan(total_ports, per_bridge, prefix, first_dp_id)
    controllers = [controller] if isinstance(controller, str) else list(controller)
    names = [b.name for b in bridges]
    if record:
        record.network(bridges=names, links=[], hosts={})
    try:
        if bridges:
            stale = set(existing(names))
            if stale:
                remove([b for b in bridges if b.name in stale], batch_ports)
        for batch in batches(bridges, batch_ports):
            vsctl(create_commands(batch, controllers),
                  f"creating bridges {batch[0].name}..{batch[-1].name} ({sum(len(b.ports) for b in batch)} ports)")
        yield bridges
    except BaseException:
        try:
            remove(bridges, batch_ports)
        except BridgeError as err:          # the error in flight says more; the run record's sweep retries
            print(f"warning: {err}", file=sys.stderr)
        raise
    else:
        remove(bridges, batch_ports)


def policy_switches(bridges: list[IdleBridge], capacity: str, queues: str = "auto") -> dict:
    """Policy entries for `bridges`: each port forwarded the normal way, and queued as `queues`."""
    return {bridge.name: {"dp_id": bridge.dp_id,
                          "flows": [{"priority": 1000, "match": {"in_port": port}, "actions": [{"output": "normal"}]}
                                    for port in bridge.ports],
                          "ports": {port: {"capacity": capacity, "queues": queues} for port in bridge.ports}}
            for bridge in bridges}
