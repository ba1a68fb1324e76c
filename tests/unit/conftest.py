"""The app's unit tests share the study topology's two fake switches under the app (tests/unit/fakes.py)."""
import pytest

from tests.unit.fakes import study_net


@pytest.fixture
def net(tmp_path):
    return study_net(tmp_path)
