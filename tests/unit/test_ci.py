"""tests/ci.py: which values of CI make a missing component fail a test rather than skip it."""
from tests.ci import on_ci


def test_only_a_true_ci_counts_as_ci():
    assert [on_ci({"CI": v}) for v in ("true", "1", "yes", " True ", "YES")] == [True] * 5
    assert [on_ci({"CI": v}) for v in ("false", "0", "no", "")] == [False] * 4
    assert not on_ci({})
