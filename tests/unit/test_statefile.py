"""controller/adapters/statefile.py: the policy in force kept across restarts; a file that is not
exactly a saved state is refused with one line (the controller then leaves the switches as they are),
never read as "cleared"."""
import json

import pytest

from controller.adapters.statefile import StateFile
from controller.core.errors import PolicyError
from controller.core.keeper import SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY
from tests.unit.test_policy import not_a_file, unblocked


def test_a_saved_policy_a_cleared_one_and_none_at_all(tmp_path):
    state = StateFile(tmp_path / "state.json")
    assert state.read() == (SAVED_ABSENT, None)
    state.write({"name": "p"})
    assert state.read() == (SAVED_POLICY, {"name": "p"})
    state.write(None)
    assert state.read() == (SAVED_CLEARED, None)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]    # no temporary file left


@pytest.mark.parametrize("content", ["{}", "[1, 2, 3]", '"garbage"', "null", "3", '{"policy": [1]}',
                                     '{"policy": "reserve", "saved": 1}', "", '{"policy": {"name": "p"', "\x00\xff"])
def test_a_file_that_is_not_a_saved_state_is_refused_in_one_line(tmp_path, content):
    path = tmp_path / "state.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(PolicyError) as err:
        StateFile(path).read()
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_a_file_that_cannot_be_written_leaves_the_old_one_whole(tmp_path):
    path = tmp_path / "state.json"
    StateFile(path).write({"name": "old"})
    with pytest.raises(TypeError):
        StateFile(path).write({"name": object()})           # not JSON: nothing written
    assert json.loads(path.read_text())["policy"] == {"name": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


@pytest.mark.parametrize("kind", ["fifo", "directory", "too large"])
def test_a_state_file_that_is_not_a_regular_file_within_1_mib_is_refused_in_one_line(tmp_path, kind):
    path = not_a_file(tmp_path, kind)
    err = unblocked(StateFile(path).read)
    assert isinstance(err, PolicyError)
    assert str(err).startswith(f"{path}: ") and "\n" not in str(err)
