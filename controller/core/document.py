"""Reading policy documents (YAML files, JSON bodies) safely, before any of their fields is looked at.

Pure (plain file reading aside). A document is refused, with one PolicyError that says why and how to
fix it, when it is not a regular file (a FIFO would block its reader, a device never end), larger than
MAX_BYTES, not UTF-8, not valid YAML/JSON, repeats a key (YAML and JSON parsers keep
the last one silently), nests deeper than MAX_DEPTH, or expands to more than MAX_NODES values
(YAML aliases can make a few lines stand for billions: the "billion laughs").
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from controller.core.errors import PolicyError

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 100_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key that a mapping repeats."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            mark = key_node.start_mark
            try:
                repeated = key in seen
            except TypeError:   # a list or mapping (`? [a, b]`): not a key a Python dict can hold
                raise PolicyError(f"line {mark.line + 1}: key {_shown(key)} is a list or mapping; a key is a name "
                                  "or a number") from None
            if repeated:
                raise PolicyError(f"line {mark.line + 1}: key {_shown(key)} appears twice in one mapping; keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)


def mapping(value: Any, where: str, *, error: type[Exception]) -> dict[Any, Any]:
    """`value` as a mapping (nothing, an empty YAML value, as an empty one); else `error` naming `where`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(f"{where}: expected a mapping of keys to values, got {type(value).__name__}")
    return value


_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,39}$")


def known_keys(doc: dict[Any, Any], where: str, allowed: tuple[str, ...], *, error: type[Exception],
               kind: str) -> None:
    """Every key of `doc` one of `allowed`; else `error` naming the key (`where`.key) and the keys there are.
    A key not even shaped like a field is not quoted back: the file may be no `kind` file (a secret, say)."""
    for key in doc:
        if key in allowed:
            continue
        if isinstance(key, str) and _FIELD_NAME.match(key):
            raise error(f"{where}.{key}: unknown key; use one of {', '.join(allowed)}")
        raise error(f"{where}: a key that is not a field name (is this a {kind} file?); use only {', '.join(allowed)}")


def whole(value: Any, where: str, low: int, high: int, *, error: type[Exception]) -> int:
    """`value` as a whole number from `low` to `high` (an int, not a bool or a float); else `error`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{where}: {_shown(value)} is not a whole number from {low} to {high}")
    number: int = value
    return number


def read_file(path: str | Path, where: str) -> bytes:
    """A regular file's bytes, refused with one PolicyError when it is anything else or larger than
    MAX_BYTES (read no further than that). OSError (absent, unreadable) is the caller's to word.
    O_NONBLOCK: opening a FIFO would otherwise wait for a writer; fstat then refuses it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PolicyError(f"{where}: not a regular file (a directory, FIFO or device); give the path of a file")
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise PolicyError(f"{where}: more than the {MAX_BYTES} bytes this file may have; check the path, or make "
                          "it smaller")
    return data


def load_yaml(data: bytes | str, where: str, what: str = "policy") -> Any:
    """`data` parsed, refused as the module says; `what` the document is, for the fix a refusal names."""
    text = _text(data, where, what)
    try:
        root = yaml.compose(text, Loader=_UniqueKeyLoader)
        if root is None:
            return None
        _check_shape(root, what)
        loader = _UniqueKeyLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except PolicyError as err:
        raise PolicyError(f"{where}: {err}") from None
    except RecursionError:
        raise PolicyError(f"{where}: nested deeper than {MAX_DEPTH} levels; a {what} is not that deep") from None
    except yaml.YAMLError as err:
        # The problem and where, never PyYAML's excerpt of the text: the file may not be a policy at all.
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else \
            f" at character {err.position + 1}" if isinstance(err, yaml.reader.ReaderError) else ""
        problem = getattr(err, "problem", None) or getattr(err, "reason", None) or "unreadable"
        raise PolicyError(f"{where}: not valid YAML ({problem}{at}); fix the syntax") from None


def read_yaml(path: Path, where: str, *, error: type[Exception], what: str) -> Any:
    """A YAML file (`what`: e.g. a traffic file) read and parsed as read_file and load_yaml do, every problem
    one `error` naming the file and the fix (a directory, a file not UTF-8 or not YAML, one it cannot read)."""
    try:
        return load_yaml(read_file(path, where), where, what)
    except PolicyError as err:
        raise error(str(err)) from None
    except OSError as err:
        raise error(f"{where}: cannot read it ({err.strerror}); check the path and its permissions") from None


def load_json(data: bytes | str, where: str) -> Any:
    text = _text(data, where)
    try:
        document = json.loads(text, object_pairs_hook=_unique_pairs)
    except RecursionError:
        raise PolicyError(f"{where}: nested deeper than {MAX_DEPTH} levels; a policy is not that deep") from None
    except PolicyError as err:
        raise PolicyError(f"{where}: {err}") from None
    except ValueError as err:
        raise PolicyError(f"{where}: not JSON ({err}); send the policy as a JSON object") from None
    if _json_depth(document) > MAX_DEPTH:
        raise PolicyError(f"{where}: nested deeper than {MAX_DEPTH} levels; a policy is not that deep")
    return document


def _text(data: bytes | str, where: str, what: str = "policy") -> str:
    size = len(data.encode() if isinstance(data, str) else data)
    if size > MAX_BYTES:
        raise PolicyError(f"{where}: {size} bytes, more than the {MAX_BYTES} a {what} may have; split it or "
                          "remove what it does not need")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{where}: not UTF-8 text; save the {what} as UTF-8") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) < len(pairs):   # the first key seen again, looked for only then: an object may have thousands
        keys = [k for k, _ in pairs]
        repeated = next(k for k in keys if keys.count(k) > 1)
        raise PolicyError(f"key {_shown(repeated)} appears twice in one object; keep one")
    return found


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _check_shape(root: yaml.Node, what: str) -> None:
    """Depth and expanded size of a composed YAML graph, aliases counted as often as they are used.
    Memoised per node, so an alias bomb is measured in time proportional to its text."""
    sizes: dict[int, tuple[int, int]] = {}   # id(node) → (expanded values, depth)

    def measure(node: yaml.Node, path: tuple[int, ...]) -> tuple[int, int]:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in path or len(path) > MAX_DEPTH:
            raise PolicyError(f"nested deeper than {MAX_DEPTH} levels; a {what} is not that deep")
        children = node.value if isinstance(node, yaml.SequenceNode) else \
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
        total, depth = 1, 0
        for child in children:
            size, child_depth = measure(child, path + (id(node),))
            total, depth = total + size, max(depth, child_depth)
            if total > MAX_NODES:
                raise PolicyError(f"expands to more than {MAX_NODES} values (YAML aliases counted each time "
                                  f"they are used); write the {what} out or use fewer aliases")
        sizes[id(node)] = (total, depth + 1)
        return sizes[id(node)]

    measure(root, ())


def _json_depth(value: Any) -> int:
    depth, level = 0, [(value, 1)]
    while level:
        item, d = level.pop()
        depth = max(depth, d)
        if d > MAX_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        level.extend((child, d + 1) for child in children)
    return depth
