"""A private etcd for a cluster of controllers on this host (the tests, bench/cluster.py and the study's
--controllers): loopback only, its own data directory and ports, never the system's etcd on 2379.
Stopped, and its data removed, when the block ends, an error and Ctrl-C included; with a run record, by
the next run (or `topo/run.py clean`) if this one is killed."""
from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from topo.harness.host import RunRecord
from topo.net.processes import end

START_SECONDS = 20.0


class EtcdError(RuntimeError):
    pass


@dataclass(frozen=True)
class Pki:
    """A CA, and certificates it signed for etcd (for 127.0.0.1) and for its clients, the members."""
    ca: Path
    server: tuple[Path, Path]      # certificate, key
    client: tuple[Path, Path]

    def url(self, port: int) -> str:
        """How a member reaches this etcd: tooz's https URL with its CA and the client's certificate."""
        cert, key = self.client
        return f"etcd3+https://127.0.0.1:{port}?ca_cert={self.ca}&cert_cert={cert}&cert_key={key}"


def make_pki(directory: Path) -> Pki:
    """With openssl: a CA, etcd's certificate (its address in subjectAltName, which clients check) and a client's."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ovsqos test CA",
            "-keyout", str(ca_key), "-out", str(ca))
    made = []
    # etcd's gateway dials etcd's own gRPC with the server's certificate: it is a client's too.
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
                            ("client", "extendedKeyUsage=clientAuth")):
        cert, key, csr, ext = (directory / f"{name}{suffix}" for suffix in (".pem", "-key.pem", ".csr", ".ext"))
        ext.write_text(extension + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=ovsqos {name}", "-keyout", str(key),
                "-out", str(csr))
        openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                "-days", "2", "-extfile", str(ext), "-out", str(cert))
        made.append((cert, key))
    return Pki(ca, made[0], made[1])


@contextlib.contextmanager
def etcd(client_port: int = 23790, log: Path | None = None, record: RunRecord | None = None,
         pki: Pki | None = None, data: Path | None = None) -> Iterator[str]:
    """Yields the URL (etcd3+http://...) of a fresh etcd listening on 127.0.0.1:`client_port` (peers on the next
    port); with `pki`, over TLS, and only to clients with a certificate its CA signed. `data`: a directory of the
    caller's, kept after (etcd started again on it, or on a copy made while it was stopped, is etcd restarted, or
    restored from that copy); by default one of its own, removed after."""
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdError("etcd is not installed; run scripts/setup.sh (Debian's etcd-server)")
    kept = data is not None
    data = data or Path(tempfile.mkdtemp(prefix="ovsqos-etcd-"))
    if record and not kept:
        record.directory(data)
    scheme = "https" if pki else "http"
    client, peer = f"{scheme}://127.0.0.1:{client_port}", f"http://127.0.0.1:{client_port + 1}"
    tls = ["--cert-file", str(pki.server[0]), "--key-file", str(pki.server[1]), "--client-cert-auth",
           "--trusted-ca-file", str(pki.ca)] if pki else []
    with open(log, "w") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:   # the child keeps its own
        proc = subprocess.Popen([binary, "--name", "ovsqos", "--data-dir", str(data / "data"),
                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", f"ovsqos={peer}", *tls], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    if record:
        record.process(proc.pid, "etcd")
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if proc.poll() is not None:
                raise EtcdError(f"etcd exited with {proc.returncode} at start (ports {client_port}-{client_port + 1} "
                                "in use?)")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{client}/health", timeout=1, context=_context(pki)) as answer:
                    if b'"health":"true"' in answer.read():
                        break
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd did not become healthy within {START_SECONDS:g} s")
            time.sleep(0.1)
        yield pki.url(client_port) if pki else f"etcd3+{client}"
    finally:
        end(proc, 10)
        if not kept:
            shutil.rmtree(data, ignore_errors=True)


def _context(pki: Pki | None) -> ssl.SSLContext | None:
    if pki is None:
        return None
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(*map(str, pki.client))
    return context
