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
from controller.core.normalised import normalised_document
from controller.core.policy import DISCIPLINES, MAX_PORT, QOS_TYPES, QUEUE_MODES, Policy, parse_policy
from tests.unit.test_policy import shipped

# Derandomised: the same examples on every run, so that CI never fails on a draw a developer's run did not make.
BOUNDED = settings(max_examples=200, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])

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
        policy = outcome(lambda: parse_policy(document))
        assert isinstance(policy, (Policy, PolicyError))
        if isinstance(policy, Policy):
            sound(policy)


def sound(policy: Policy) -> None:
    """What the controller relies on of every policy the check accepts (a check that let any of these through
    would pass the properties above by returning a Policy for anything); and what it prints reads back the same."""
    queues = [c.queue for c in policy.classes]
    assert len(set(queues)) == len(queues) and all(1 <= q <= 7 for q in queues) and policy.name
    reserved = 0.0
    for c in policy.classes:
        assert 0 <= c.min_share <= c.max_share <= 1 and c.max_share > 0 and 0 <= c.dscp <= 63, c
        reserved += c.min_share
    assert reserved <= 1 + 1e-9
    config = policy.congestion
    assert config.samples >= 1 and 0 <= config.clear_utilisation <= config.utilisation <= 1 and config.hold_seconds >= 0
    assert 0.05 <= policy.poll_interval <= 60 and (policy.fast_poll_interval == 0 or
                                                    0.01 <= policy.fast_poll_interval <= policy.poll_interval)
    rules = [p for sw in policy.switches for p in sw.ports] + \
        ([policy.network.ports] if policy.network and policy.network.ports else [])
    for rule in rules:
        assert rule.queues in QUEUE_MODES and rule.discipline in DISCIPLINES and rule.qos_type in QOS_TYPES, rule
        assert rule.capacity_bps is None or rule.capacity_bps >= 1000, rule
        assert 1 <= rule.queue_packets <= 100_000, rule
    for sw in policy.switches:
        assert 1 <= sw.dp_id < 2**64 and all(1 <= p.port_no <= MAX_PORT for p in sw.ports)
    assert parse_policy(json.loads(json.dumps(normalised_document(policy)))) == policy


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


def _leaves(node: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, (*path, key))]
    if isinstance(node, list):
        return [leaf for k, value in enumerate(node) for leaf in _leaves(value, (*path, k))]
    return [path]


EDGES = [0, -1, 1, 0.0, 1e-9, 0.5, 1.5, 2**64, 10**9, "0%", "101%", "-5%", "0bit", "1bit", "0Mbit", "", None, True]


def test_a_shipped_policy_with_an_edge_value_at_any_leaf_is_refused_or_sound():
    """Bounds, every one: each leaf (a share, a rate, a count, a port) of each shipped policy given each value at
    or past an edge, in turn."""
    for name in ("none", "reserve", "auto"):
        for path in _leaves(_shipped(name)):
            for edge in EDGES:
                document = copy.deepcopy(_shipped(name))
                node = document
                for key in path[:-1]:
                    node = node[key]
                node[path[-1]] = edge
                policy_or_error(lambda document=document: document)
