"""controller/adapters/statefile.py: the policy in force kept across restarts; a file that is not
exactly a saved state is refused with one line (the controller then leaves the switches as they are),
never read as "cleared"; and one controller per state file, but for an active/standby pair."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.adapters.statefile import StateFile, StateFileInUse
from controller.core.errors import PolicyError
from controller.core.keeper import SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY
from tests.unit.test_policy import not_a_file, unblocked


def test_a_saved_policy_a_cleared_one_and_none_at_all(tmp_path):
    state = StateFile(tmp_path / "state.json")
    assert state.read() == (SAVED_ABSENT, None, 0)
    state.write({"name": "p"}, 1)
    assert state.read() == (SAVED_POLICY, {"name": "p"}, 1)
    state.write(None, 2)
    assert state.read() == (SAVED_CLEARED, None, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".state.json.lock", "state.json"]   # no temporary file


@pytest.mark.parametrize("content", ["{}", "[1, 2, 3]", '"garbage"', "null", "3", '{"policy": [1]}',
                                     '{"policy": null, "revision": -1}', '{"policy": null, "revision": "3"}',
                                     '{"policy": null, "revision": true}',
                                     '{"policy": "reserve", "saved": 1}', "", '{"policy": {"name": "p"', "\x00\xff"])
def test_a_file_that_is_not_a_saved_state_is_refused_in_one_line(tmp_path, content):
    path = tmp_path / "state.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(PolicyError) as err:
        StateFile(path).read()
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_a_file_that_cannot_be_written_leaves_the_old_one_whole(tmp_path):
    path = tmp_path / "state.json"
    state = StateFile(path)
    state.write({"name": "old"}, 1)
    with pytest.raises(TypeError):
        state.write({"name": object()}, 1)           # not JSON: nothing written
    assert json.loads(path.read_text())["policy"] == {"name": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".state.json.lock", "state.json"]


@pytest.mark.parametrize("kind", ["fifo", "directory", "too large"])
def test_a_state_file_that_is_not_a_regular_file_within_1_mib_is_refused_in_one_line(tmp_path, kind):
    path = not_a_file(tmp_path, kind)
    err = unblocked(StateFile(path).read)
    assert isinstance(err, PolicyError)
    assert str(err).startswith(f"{path}: ") and "\n" not in str(err)


def test_a_second_controller_on_the_same_state_file_is_refused_in_one_line_while_the_first_holds_it(tmp_path):
    path = tmp_path / "owner" / "default.json"
    first = StateFile(path)            # makes the directory and takes the lock
    with pytest.raises(StateFileInUse) as err:
        StateFile(path)                # another open file description: flock refuses it as it would another process
    assert err.value.code == (f"error: {path} is in use by another controller, which holds {path.parent}/"
                              ".default.json.lock; give this one its own [qos] state_file, or stop the other (an "
                              "active/standby pair sets [qos] standby = true on both)")
    other = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from controller.adapters."
                            "statefile import StateFile; StateFile(Path(sys.argv[1]))", str(path)],
                           cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert (other.returncode, other.stderr) == (1, err.value.code + "\n")   # Python prints it: no traceback
    first.write({"name": "p"}, 1)
    assert first.read() == (SAVED_POLICY, {"name": "p"}, 1)


def test_an_active_standby_pair_shares_its_state_file_unlocked_so_a_stopped_active_blocks_no_save(tmp_path):
    path = tmp_path / "state.json"
    stopped, active = StateFile(path, shared=True), StateFile(path, shared=True)
    active.write({"name": "p"}, 1)
    assert stopped.read() == (SAVED_POLICY, {"name": "p"}, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]      # no lock file taken
    StateFile(path)                     # nor held: an unshared one still gets it


def test_a_directory_that_cannot_hold_the_lock_leaves_the_failure_to_saving(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    state = StateFile(blocker / "state.json")     # a file where its directory should be: no lock, no refusal
    with pytest.raises(OSError):
        state.write({"name": "p"}, 1)
