"""Policy files with a `base:` (controller/core/policy.py load_document): deep merge, loops and missing
files refused by name, bases not accepted from a REST body, and the study policies written over one base."""
import dataclasses
from pathlib import Path

import pytest
import yaml

from controller.core.policy import PolicyError, load_document, merge_documents, parse_policy

REPO = Path(__file__).resolve().parents[2]
# policies/{none,reserve,auto}.yaml as they were before they shared policies/bases/study.yaml.
BEFORE = Path(__file__).resolve().parent / "data" / "study_policies_before"


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(PolicyError) as err:
        load_document(path)
    return str(err.value)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """Files named relative to the working directory, as a user types them."""
    monkeypatch.chdir(tmp_path)
    return Path(".")


# --- merging -----------------------------------------------------------------------------------------

def test_mappings_merge_key_by_key_and_anything_else_replaces():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2], "s": "base", "m": {"k": 1}}
    over = {"a": {"y": {"q": 3}, "z": 4}, "l": [3], "s": {"now": "a mapping"}, "m": 5, "new": True}
    assert merge_documents(base, over) == {"a": {"x": 1, "y": {"p": 1, "q": 3}, "z": 4}, "l": [3],
                                           "s": {"now": "a mapping"}, "m": 5, "new": True}
    assert base == {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2], "s": "base", "m": {"k": 1}}


def test_a_base_is_found_relative_to_the_file_and_merged_under_it(tmp_path):
    write(tmp_path, "common/base.yaml", "name: base\nswitches: {s1: {dp_id: 1, ports: {1: {capacity: 5Mbit}}}}\n")
    path = write(tmp_path, "p.yaml",
                 "base: common/base.yaml\nname: p\nswitches: {s1: {ports: {1: {queues: reserve}}}}\n")
    assert load_document(path) == {"name": "p",
                                   "switches": {"s1": {"dp_id": 1, "ports": {1: {"capacity": "5Mbit",
                                                                                 "queues": "reserve"}}}}}


def test_bases_chain_and_each_is_relative_to_the_file_that_names_it(tmp_path):
    write(tmp_path, "a/b/grand.yaml", "name: grand\ndescription: from grand\nclasses: {tcp: {queue: 1}}\n")
    write(tmp_path, "a/parent.yaml", "base: b/grand.yaml\nname: parent\nswitches: {s1: {dp_id: 1}}\n")
    path = write(tmp_path, "child.yaml", "base: a/parent.yaml\nname: child\n")
    assert load_document(path) == {"name": "child", "description": "from grand", "classes": {"tcp": {"queue": 1}},
                                   "switches": {"s1": {"dp_id": 1}}}


def test_a_document_without_a_base_is_read_as_it_is(tmp_path):
    assert load_document(write(tmp_path, "p.yaml", "- a list\n")) == ["a list"]


# --- refused, naming the files -----------------------------------------------------------------------

def test_a_loop_of_bases_is_refused_naming_the_files(here):
    write(here, "a.yaml", "base: b.yaml\nname: a\n")
    write(here, "b.yaml", "base: a.yaml\n")
    assert refusal(Path("a.yaml")) == "a.yaml: base b.yaml → a.yaml is a loop; remove base: from one of these files"


def test_a_longer_loop_and_a_file_that_is_its_own_base_are_refused(here):
    write(here, "a.yaml", "base: sub/b.yaml\n")
    write(here, "sub/b.yaml", "base: ../c.yaml\n")
    write(here, "c.yaml", "base: sub/b.yaml\n")
    write(here, "self.yaml", "base: ./self.yaml\n")
    assert refusal(Path("a.yaml")) == ("a.yaml: base sub/b.yaml → c.yaml → sub/b.yaml is a loop; remove "
                                       "base: from one of these files")
    assert refusal(Path("self.yaml")) == "self.yaml: base self.yaml is a loop; remove base: from one of these files"


def test_a_missing_base_is_refused_naming_both_files(here):
    write(here, "a.yaml", "base: b.yaml\n")
    write(here, "b.yaml", "base: gone.yaml\n")
    assert refusal(Path("a.yaml")) == ("a.yaml: base b.yaml → gone.yaml: cannot read policy file (No such file or "
                                       "directory); check the path")


def test_a_base_that_is_a_directory_is_refused(here):
    write(here, "a.yaml", "base: policies\n")
    Path("policies").mkdir()
    assert refusal(Path("a.yaml")) == ("a.yaml: base policies: not a regular file (a directory, FIFO or device); give "
                                       "the path of a file")


def test_an_unreadable_base_is_refused(here):
    write(here, "a.yaml", "base: loop.yaml\n")
    Path("loop.yaml").symlink_to("loop.yaml")          # unreadable whoever reads it, root included
    assert refusal(Path("a.yaml")) == ("a.yaml: base loop.yaml: cannot read policy file (Too many levels of symbolic "
                                       "links); check the path")


def test_a_base_that_is_not_valid_yaml_is_refused_naming_it(here):
    write(here, "a.yaml", "base: b.yaml\n")
    write(here, "b.yaml", "name: b\nname: again\n")
    assert refusal(Path("a.yaml")) == "a.yaml: base b.yaml: line 2: key 'name' appears twice in one mapping; keep one"


@pytest.mark.parametrize("text", ["- a\n- b\n", ""])
def test_a_base_that_is_not_a_mapping_is_refused(here, text):
    write(here, "a.yaml", "base: b.yaml\n")
    write(here, "b.yaml", text)
    assert refusal(Path("a.yaml")) == ("a.yaml: base b.yaml: not a mapping of policy fields; a base holds fields such "
                                       "as classes and switches")


@pytest.mark.parametrize("value", ["", "[a.yaml]", "7"])
def test_a_base_that_is_not_a_file_name_is_refused(here, value):
    write(here, "a.yaml", f"base: {value}\n")
    document_value = yaml.safe_load(f"v: {value}")["v"]
    assert refusal(Path("a.yaml")) == (f"a.yaml: base: {document_value!r} is not a file name; write e.g. "
                                       "base: study.yaml (relative to this file)")


def test_a_document_with_a_base_but_no_file_is_refused():
    with pytest.raises(PolicyError) as err:
        parse_policy({"base": "study.yaml", "name": "p", "switches": {"s1": {"dp_id": 1}}})
    assert str(err.value) == ("policy.base: bases are resolved only when a policy is loaded from its file; send the "
                              "resolved policy (python3 -m controller.check --json FILE prints it)")


def test_an_error_in_the_merged_policy_names_the_field(tmp_path):
    write(tmp_path, "base.yaml", "switches: {s1: {dp_id: 1, ports: {1: {capacity: 5Mbit}}}}\n")
    path = write(tmp_path, "p.yaml", "base: base.yaml\nname: p\nswitches: {s1: {ports: {1: {queues: fast}}}}\n")
    with pytest.raises(PolicyError, match=r"^switches\.s1\.ports\.1\.queues: 'fast' is not one of "):
        parse_policy(load_document(path))


# --- the shipped policies ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["none", "reserve", "auto"])
def test_the_study_policies_over_their_base_are_what_they_were(name):
    before = parse_policy(yaml.safe_load((BEFORE / f"{name}.yaml").read_text()))
    policy = parse_policy(load_document(REPO / "policies" / f"{name}.yaml"))
    # What they say for any other network (network:) came later; for the study's switches they are unchanged.
    assert dataclasses.replace(policy, network=None) == before
    assert policy.network is not None and policy.network.ports is not None
    assert policy.network.ports.queues == {"none": "fifo"}.get(name, name)


@pytest.mark.parametrize("name", ["none", "reserve", "auto"])
def test_the_study_policies_are_short_and_name_their_base(name):
    text = (REPO / "policies" / f"{name}.yaml").read_text()
    assert "base: bases/study.yaml" in text
    assert len(text.splitlines()) < len((BEFORE / f"{name}.yaml").read_text().splitlines()) / 2


@pytest.mark.parametrize("name", ["shared", "dumbbell"])
def test_the_other_studies_policies_still_load_without_a_base(name):
    path = REPO / "policies" / f"{name}.yaml"
    assert load_document(path) == yaml.safe_load(path.read_text())
    assert parse_policy(load_document(path)).name == name
