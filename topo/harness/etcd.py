"""A private etcd for a cluster of controllers on this host (the tests, bench/cluster.py and the study's
--controllers): loopback only, its own data directory and ports, never the system's etcd on 2379.
Stopped, and its data removed, when the block ends, an error and Ctrl-C included; with a run record, by
the next run (or `topo/run.py clean`) if this one is killed."""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from topo.harness.host import RunRecord, end

START_SECONDS = 20.0


class EtcdError(RuntimeError):
    pass


@contextlib.contextmanager
def etcd(client_port: int = 23790, log: Path | None = None, record: RunRecord | None = None) -> Iterator[str]:
    """Yields the tooz URL of a fresh etcd listening on 127.0.0.1:`client_port` (peers on the next port)."""
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdError("etcd is not installed; run scripts/setup.sh (Debian's etcd-server)")
    data = Path(tempfile.mkdtemp(prefix="ovsqos-etcd-"))
    if record:
        record.directory(data)
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{client_port + 1}"
    with open(log, "w") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:   # the child keeps its own
        proc = subprocess.Popen([binary, "--name", "ovsqos", "--data-dir", str(data / "data"),
                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", f"ovsqos={peer}"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    if record:
        record.process(proc.pid, "etcd")
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if proc.poll() is not None:
                raise EtcdError(f"etcd exited with {proc.returncode} at start (ports {client_port}-{client_port + 1} "
                                "in use?)")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{client}/health", timeout=1) as answer:
                    if b'"health":"true"' in answer.read():
                        break
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd did not become healthy within {START_SECONDS:g} s")
            time.sleep(0.1)
        yield f"etcd3+{client}"
    finally:
        end(proc, 10)
        shutil.rmtree(data, ignore_errors=True)
