"""Property-based tests (hypothesis) of what reads untrusted input: the policy parser
(controller/core/document.py and policy.py, as the REST API, controller.check and the config file use
them) and the state-file reader. Whatever the input, the result is a policy (or a saved state) or one
PolicyError of one line, never another exception."""
import copy
import functools
import json
import string
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.adapters.statefile import StateFile
from controller.core.document import load_json, load_yaml
from controller.core.errors import PolicyError
from controller.core.policy import Policy, parse_policy
from tests.unit.test_policy import shipped

BOUNDED = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                    st.sampled_from(["5Mbit", "50%", "0.5", "auto", "reserve", "fifo", "tcp", "udp", "voice", "normal",
                                     "10.0.0.0/8", "ipv4", "s1", "1"]))
structures = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4)),
    max_leaves=20)
# Pieces of YAML syntax, put together at random: complex keys, aliases, tags, flow and block collections.
YAML_PIECES = ["? ", "[a, b]", "{x: 1}", ": ", "- ", "\n", "  ", "&a ", "*a", "!!str ", "!!python/object ", "<<: ",
               "name: p", "classes:", "switches:", "s1:", "dp_id: 1", "ports:", "1:", "queues: auto", "'", '"', "#",
               "%YAML 1.1\n", "---\n", "...\n", "|\n", ">\n", "\t", "\x00", "\ufeff", ",", "null", "~", "1e999"]
yamlish = st.lists(st.sampled_from(YAML_PIECES) | st.text(string.printable, max_size=4), max_size=30).map("".join)


_shipped = functools.cache(shipped)


def outcome(read) -> Any:
    """read()'s value, or its PolicyError's message, which must be one line."""
    try:
        return read()
    except PolicyError as err:
        assert "\n" not in str(err), str(err)
        return err


def policy_or_error(document_of) -> None:
    document = outcome(document_of)
    if not isinstance(document, PolicyError):
        assert isinstance(outcome(lambda: parse_policy(document)), (Policy, PolicyError))


@BOUNDED
@given(st.binary(max_size=200) | yamlish.map(str.encode))
def test_any_bytes_as_a_yaml_file_or_a_json_body_give_a_policy_or_one_policy_error(data):
    policy_or_error(lambda: load_yaml(data, "p.yaml"))
    policy_or_error(lambda: load_json(data, "request body"))


@BOUNDED
@given(structures)
def test_any_structure_written_as_yaml_or_json_gives_a_policy_or_one_policy_error(document):
    policy_or_error(lambda: document)
    policy_or_error(lambda: load_yaml(yaml.safe_dump(document), "p.yaml"))
    policy_or_error(lambda: load_json(json.dumps(document), "request body"))


@BOUNDED
@given(st.sampled_from(["none", "reserve", "auto"]), st.data())
def test_a_shipped_policy_with_any_value_anywhere_gives_a_policy_or_one_policy_error(name, data):
    """Near misses: one value somewhere in a valid policy replaced by anything."""
    document = copy.deepcopy(_shipped(name))
    node: Any = document
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = data.draw(st.sampled_from(keys))
        if not isinstance(node[key], (dict, list)) or not node[key] or data.draw(st.booleans()):
            node[key] = data.draw(structures)
            break
        node = node[key]
    policy_or_error(lambda: document)


@BOUNDED
@given(st.binary(max_size=200) | structures.map(lambda s: json.dumps({"policy": s, "saved": 1}).encode()))
def test_any_state_file_gives_a_saved_state_or_one_policy_error(tmp_path, data):
    path = tmp_path / "state.json"
    path.write_bytes(data)
    assert isinstance(outcome(StateFile(path).read), (tuple, PolicyError))
