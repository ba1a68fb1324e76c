"""controller/adapters/liveness.py against a real etcd of the test's own: a member whose process died on this
host (its file beside the OVSDB socket held by nobody) has its lease revoked at once, from the file alone; a file
left by a process that is gone, naming a lease etcd no longer has, revokes nothing and is not taken for the
member's death (a member alive elsewhere is given the time to say it lives)."""
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

from controller.adapters.etcd import Gateway, b64
from controller.adapters.liveness import Liveness
from topo.harness.etcd import etcd

REPO = Path(__file__).resolve().parents[2]
PREFIX = "/ovs-qos/site/"

# A member's process: it marks its file with the lease it is given, and lives until it is killed.
MEMBER = """
import sys, time
from pathlib import Path
from controller.adapters.liveness import Liveness
Liveness(lambda *a: {}, "/ovs-qos/site/", "site", "c", lambda: 0, Path(sys.argv[1])).mark(int(sys.argv[2]))
print("marked", flush=True)
time.sleep(600)
"""


def lease_alive(gateway: Gateway, lease: int) -> bool:
    return int(gateway.post("/kv/lease/timetolive", {"ID": lease}).get("TTL", -1)) > 0


def test_a_dead_process_files_lease_is_revoked_at_once_and_a_stale_files_is_not_a_death(tmp_path, caplog):
    with etcd(23793, tmp_path / "etcd.log") as url:
        gateway = Gateway(url, 2.0)
        watcher = Liveness(gateway.poster(), PREFIX, "site", "a", lambda: 0, tmp_path)   # as the member makes it
        lease = int(gateway.post("/lease/grant", {"TTL": 60})["ID"])
        member = subprocess.Popen([sys.executable, "-c", MEMBER, str(tmp_path), str(lease)], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert member.stdout.readline() == "marked\n"
            watcher.suspect("c", 0.0)            # its file held: alive, and its lease not published: not known yet
            assert lease_alive(gateway, lease)
            member.send_signal(signal.SIGKILL)
            member.wait(timeout=10)
        finally:
            member.kill()
        # Its lease is not even published: the file alone, held by nobody, says its process is gone.
        assert gateway.post("/kv/range", {"key": b64(f"{PREFIX}lease/c")}).get("kvs") is None
        watcher.suspect("c", 1.0)
        assert not lease_alive(gateway, lease)

        # The same file again, its lease gone, while c (moved to another host) published a new one: nothing is
        # revoked at once, and nothing warns; c is given its time to say it lives.
        elsewhere = int(gateway.post("/lease/grant", {"TTL": 60})["ID"])
        gateway.post("/kv/put", {"key": b64(f"{PREFIX}lease/c"), "value": b64(json.dumps(elsewhere))})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="controller.adapters.liveness"):
            watcher.suspect("c", 2.0)
        assert lease_alive(gateway, elsewhere)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert watcher.due(2.0 + 0.1) < 1.0      # still waiting for its word
