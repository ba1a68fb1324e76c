"""scripts/setup.sh as the README promises it: run again on a machine it has set up (CI ran it just
before the tests), it installs nothing, creates nothing and restarts nothing."""
import subprocess
from pathlib import Path

from tests.integration.conftest import REPO, requires_ovs

pytestmark = requires_ovs   # root, and the Open vSwitch it set up running


def test_the_set_up_run_again_changes_nothing():
    stamps = {venv: (REPO / venv / ".requirements.sha256").read_text() for venv in (".venv", ".venv-ryu")}
    pid = Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text()
    done = subprocess.run(["scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "setup: ready\n", done.stdout           # no "installing", "creating" or "starting"
    assert {venv: (REPO / venv / ".requirements.sha256").read_text() for venv in stamps} == stamps
    assert Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text() == pid
    assert Path("/usr/local/bin/osken-manager").resolve() == (REPO / ".venv" / "bin" / "osken-manager").resolve()
