"""A controller whose event handler raises ends, exit status 70 and one line on stderr, rather than living on
deaf to its switches; the flows and queues it put stay in place for the next start. The bug is planted
from outside: the real controller under os-ken, its core's handler made to raise on a status request once
a file appears."""
import subprocess
import sys
import time

from tests.integration.conftest import REPO, controller_config, remove_rows, requires_ovs, stop_controller
from tests.integration.test_reliability import bridges, policy, port_qos, rest, sh, wait  # noqa: F401

pytestmark = requires_ovs

PLANTED = """
import sys
from pathlib import Path
from os_ken.cmd.manager import main       # monkey-patches first, as osken-manager does
from controller.core import controller

trigger, real = Path(sys.argv.pop(1)), controller.Controller.handle

def handle(self, event, now):
    if type(event).__name__ == "GetStatus" and trigger.exists():
        raise RuntimeError("a planted bug")
    return real(self, event, now)

controller.Controller.handle = handle
sys.exit(main())
"""


def our_flows(bridge: str) -> list[str]:
    return [line for line in sh("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge, "--no-stats").splitlines()
            if "cookie=0x5153" in line]


def answers() -> bool:
    try:
        return rest("GET", "/status")[0] == 200
    except OSError:
        return False


def test_a_handler_that_raises_ends_the_controller_and_leaves_flows_and_queues(tmp_path, bridges):  # noqa: F811
    trigger = tmp_path / "raise"
    config = controller_config(tmp_path / "qos.conf")
    log = open(tmp_path / "controller.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", PLANTED, str(trigger), "--config-file", str(config),
                             str(REPO / "controller" / "qos_app.py")], cwd=REPO, stdout=log,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait(lambda: proc.poll() is not None or answers(), 30, "the controller's API")
        assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-2000:]
        wait(lambda: len(rest("GET", "/status")[1]["switches"]) == 2, 20, "both bridges connected")
        assert rest("PUT", "/policy", policy("crash"))[0] == 200
        wait(lambda: all(port_qos(f"{b}p2") != "[]" for b in bridges), 20, "queues on both bridges")
        flows = {b: our_flows(b) for b in bridges}
        queues = {b: port_qos(f"{b}p2") for b in bridges}
        assert all(flows.values())
        trigger.touch()
        try:
            rest("GET", "/status")
        except OSError:
            pass                               # the connection closes as the process ends
        assert proc.wait(timeout=20) == 70
        stderr = proc.stderr.read()                # os-ken logs there: the journal, under the service
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert errors == ["error: the controller failed handling GetStatus (its log has the traceback); exiting"]
        assert "RuntimeError: a planted bug" in stderr
        time.sleep(1)
        assert {b: our_flows(b) for b in bridges} == flows and {b: port_qos(f"{b}p2") for b in bridges} == queues
    finally:
        if proc.poll() is None:
            stop_controller(proc)
        remove_rows("test")   # what the crash left in place, which no later run of ours owns
