"""The controller's container image (Containerfile, scripts/build-image.sh, docs/container.md), run as a
user runs it: built (or found up to date) by the script, then started with podman against two test
bridges on the host's OVS, with the documented options (host network, OVS's run directory mounted, a
read-only config mount, the state in a volume, every capability dropped but NET_ADMIN, a read-only
root). It takes both bridges, a PUT through its REST API puts Queue rows in OVSDB and HTB classes on
the reserving ports, /metrics answers, `podman stop` stops it cleanly within the stop timeout and leaves
flows, queues and classes as they were, and a start from the same volume carries on with the policy in
force. Nothing is left: the container, its volume and the bridges are removed, the queues taken off."""
import atexit
import configparser
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, leftovers, requires_ovs
from tests.integration.test_reliability import bridges, policy  # noqa: F401 (bridges: a fixture)

pytestmark = requires_ovs
IMAGE = "localhost/ovs-qos-controller:latest"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "containers" / "containers.conf")}
CAP_NET_ADMIN = 1 << 12


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, env=PODMAN_ENV, timeout=timeout)
    assert not check or done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done


BUILD = ["bash", "scripts/build-image.sh"]
_background: tuple[subprocess.Popen, Path] | None = None


def build_in_background(log: Path) -> None:
    """Start the first build now. On a cold cache it is minutes of debootstrap and apt, mostly waiting on the
    mirror; test_vm.py, started before the first test (tests/conftest.py), starts it to cover that wait."""
    global _background
    with open(log, "w") as out:
        proc = subprocess.Popen(BUILD, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    atexit.register(lambda: proc.poll() is None and proc.terminate())   # its traps remove what it made
    _background = (proc, log)


def build() -> subprocess.CompletedProcess:
    """A build as a user runs it, or the end of the one started in the background (its output in stdout)."""
    global _background
    if _background is None:
        return subprocess.run(BUILD, cwd=REPO, capture_output=True, text=True, timeout=1200)
    (proc, log), _background = _background, None
    code = proc.wait(timeout=1200)
    return subprocess.CompletedProcess(BUILD, code, log.read_text(), "")


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built by the script as a user builds it (on a fresh machine: podman, the base, the venv)."""
    done = build()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return podman("image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip()


@pytest.mark.timeout(900)   # the first test pays for the module's cold build: about 4 min on a fresh machine
def test_a_second_build_finds_the_image_up_to_date(image):
    done = build()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "is there" in done.stdout, done.stdout          # the base is reused, not made again
    assert podman("image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip() == image


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}/qos/v1"

    def __call__(self, method: str, path: str, body=None):
        req = urllib.request.Request(self.base + path, data=None if body is None else json.dumps(body).encode(),
                                     method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as err:
            return err.code, json.load(err)

    def up(self) -> bool:
        try:
            return self("GET", "/status")[0] == 200
        except OSError:
            return False

    def in_sync(self, name: str) -> bool:
        status = self("GET", "/status")[1]
        return status["policy"] == name and len(status["switches"]) == 2 and \
            all(s["in_sync"] for s in status["switches"].values())


def wait(condition, seconds: float, what: str, log=lambda: ""):
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s\n{log()}"
        time.sleep(0.2)


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def htb_classes(iface: str) -> list[str]:
    """`tc class show`'s lines for the device, counters left out."""
    return sorted(line for line in sh("tc", "class", "show", "dev", iface).splitlines() if line.startswith("class htb"))


def flows(bridge: str) -> list[str]:
    """The controller's flows on the bridge, without their counters."""
    return [re.sub(r" (duration|n_packets|n_bytes|idle_age|hard_age)=[^ ,]+,", "", line)
            for line in sh("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge).splitlines() if "cookie=0x5153" in line]


def queue_rows() -> set[str]:
    return set(filter(None, sh("ovs-vsctl", "--columns=_uuid", "list", "Queue").splitlines()))


def config_dir(tmp_path: Path) -> tuple[Path, int, int]:
    """/etc/ovs-qos-controller to mount: the image's own qos.conf with the REST API and metrics on free
    ports; (the directory, the API's port, the metrics' port)."""
    api_port, metrics_port = free_port(), free_port()
    conf = configparser.ConfigParser(interpolation=None)
    conf.optionxform = str   # type: ignore[assignment,method-assign]
    conf.read_string(podman("run", "--rm", "--entrypoint", "cat", IMAGE, "/etc/ovs-qos-controller/qos.conf").stdout)
    conf["qos"].update(api_port=str(api_port), metrics_port=str(metrics_port), owner="imagetest")
    etc = tmp_path / "etc"
    etc.mkdir()
    with open(etc / "qos.conf", "w") as f:
        conf.write(f)
    return etc, api_port, metrics_port


def bound_capabilities(container: str) -> list[int]:
    """The capability bound set of the container's PID 1 (tini) and of its one child, the controller."""
    init = podman("inspect", "-f", "{{.State.Pid}}", container).stdout.strip()
    child = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    assert len(child) == 1, child
    return [int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("CapBnd:")).split()[1], 16) for pid in (init, child[0])]


@pytest.fixture
def container(image, bridges, tmp_path):  # noqa: F811 (bridges: the fixture imported above)
    """The image run as docs/container.md runs it, with OpenFlow on 6653 (where the bridges look) and
    the REST API and metrics on free ports; (name, API, metrics port, bridges, logs). Removed afterwards,
    with its volume."""
    tag = uuid.uuid4().hex[:6]
    name, volume = f"ovsqos-test-{tag}", f"ovsqos-test-state-{tag}"
    etc, api_port, metrics_port = config_dir(tmp_path)
    podman("volume", "create", volume)
    run = ["run", "-d", "--name", name, "--network", "host", "--cap-drop", "all", "--cap-add", "NET_ADMIN",
           "--read-only", "-v", f"{etc}:/etc/ovs-qos-controller:ro", "-v", "/var/run/openvswitch:/var/run/openvswitch",
           "-v", f"{volume}:/var/lib/ovs-qos-controller", IMAGE]
    api = Api(api_port)
    def logs() -> str:
        done = podman("logs", name, check=False)
        return (done.stdout + done.stderr)[-3000:]
    try:
        podman(*run)
        wait(api.up, 60, "the REST API answering", logs)
        yield name, api, metrics_port, bridges, logs
    finally:
        if podman("container", "exists", name, check=False).returncode == 0:
            if podman("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true" and api.up():
                api("DELETE", "/policy")
            podman("rm", "-f", "-t", "15", name, check=False)
        podman("volume", "rm", "-f", volume, check=False)
    assert podman("container", "exists", name, check=False).returncode == 1
    assert podman("volume", "exists", volume, check=False).returncode == 1
    left = leftovers()
    assert (left["qos"], left["queues"], left["controller"]) == ("", "", ""), left


def test_the_image_takes_the_bridges_puts_queues_and_a_stop_leaves_them(container):
    name, api, metrics_port, names, logs = container
    queues_before = queue_rows()
    assert bound_capabilities(name) == [CAP_NET_ADMIN, CAP_NET_ADMIN]   # NET_ADMIN alone, for tc
    wait(lambda: len(api("GET", "/status")[1]["switches"]) == 2, 30, "both bridges connected", logs)
    assert api("PUT", "/policy", policy("image"))[0] == 200, logs()
    wait(lambda: api.in_sync("image"), 30, "the policy in force on both bridges", logs)

    ifaces = [f"{bridge}p2" for bridge in names]            # port 2 of each bridge reserves
    queues = queue_rows() - queues_before
    assert len(queues) >= 2 * 2, queues                         # a queue per class, per port
    for iface in ifaces:
        assert sh("ovs-vsctl", "get", "port", iface, "qos").strip() != "[]"
        assert len(htb_classes(iface)) >= 3, sh("tc", "class", "show", "dev", iface)   # 1:fffe and a class per queue
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    samples = [line for line in metrics.splitlines() if line.startswith("ovsqos_port_capacity_bytes_per_second{")]
    assert {dp for dp in ("0000000000000a01", "0000000000000a02") if any(dp in line for line in samples)} == \
        {"0000000000000a01", "0000000000000a02"}, metrics[-3000:]   # each reserving port's capacity

    before = {b: flows(b) for b in names}, queue_rows(), {i: htb_classes(i) for i in ifaces}
    assert all(before[0].values())
    started = time.monotonic()
    podman("stop", name, timeout=60)                            # SIGTERM, and SIGKILL after 10 s
    took = time.monotonic() - started
    code = podman("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
    assert took < 10 and code == "0", f"stopped in {took:.1f} s with exit code {code}\n{logs()}"
    time.sleep(2)                                               # a controller's absence shows in OVS within 1 s
    after = {b: flows(b) for b in names}, queue_rows(), {i: htb_classes(i) for i in ifaces}
    assert after == before

    # Started again from the same volume: the policy in force was saved there, and is adopted as it is.
    podman("start", name)
    wait(api.up, 60, "the REST API answering after a start", logs)
    wait(lambda: api.in_sync("image"), 30, "the saved policy in force again", logs)
    assert ({b: flows(b) for b in names}, queue_rows()) == before[:2]
    assert api("DELETE", "/policy")[0] == 200
    wait(lambda: not queue_rows() - queues_before, 30, "the queues taken off", logs)


@pytest.fixture
def podman_api():
    """Podman's Docker-compatible API on a socket of its own (`podman system service`), for docker-compose."""
    where = Path(tempfile.mkdtemp(prefix="ovsqos-podman-"))
    sock = where / "podman.sock"
    log = open(where / "service.log", "w")
    proc = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"], env=PODMAN_ENV,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait(sock.exists, 30, "podman's API socket", lambda: (where / "service.log").read_text())
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(where)


def test_the_compose_file_runs_the_controller_through_podmans_api(image, bridges, podman_api, tmp_path):  # noqa: F811
    """docker-compose.yml's controller service, with Debian's docker-compose talking to podman: it starts,
    takes the bridges, answers /metrics with NET_ADMIN its only capability, stops cleanly, and `down -v`
    leaves nothing."""
    etc, api_port, metrics_port = config_dir(tmp_path)
    env = {**PODMAN_ENV, "DOCKER_HOST": podman_api, "OVSQOS_CONFIG": str(etc)}
    project = f"ovsqostest{uuid.uuid4().hex[:6]}"
    def compose(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker-compose", "-p", project, *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
    api = Api(api_port)
    ids: list[str] = []
    def logs() -> str:
        done = podman("logs", ids[0], check=False) if ids else compose("logs")
        return (done.stdout + done.stderr)[-3000:]
    try:
        done = compose("up", "-d", "controller")
        assert done.returncode == 0, done.stderr
        ids.append(compose("ps", "-q", "controller").stdout.strip())
        wait(api.up, 60, "the REST API answering", logs)
        wait(lambda: len(api("GET", "/status")[1]["switches"]) == 2, 30, "both bridges connected", logs)
        assert bound_capabilities(ids[0]) == [CAP_NET_ADMIN, CAP_NET_ADMIN]
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
            assert "ovsqos_" in resp.read().decode()
        started = time.monotonic()
        done = compose("stop", "controller")
        took = time.monotonic() - started
        code = podman("inspect", "-f", "{{.State.ExitCode}}", ids[0]).stdout.strip()
        assert done.returncode == 0 and took < 10 and code == "0", f"{took:.1f} s, exit {code}\n{logs()}"
    finally:
        done = compose("down", "-v")
    assert done.returncode == 0, done.stderr
    assert not ids or podman("container", "exists", ids[0], check=False).returncode == 1
    assert not [v for v in podman("volume", "ls", "-q").stdout.split() if v.startswith(project)]
