"""Mutants generated over the safety and decision core, for tests/mutants.py --sweep (docs/testing.md).

Every function of the modules in SWEPT gets, at each place it applies: a comparison turned to its neighbour
or its negation (< and <=, == and !=, in and not in, is and is not), `and` and `or` swapped, a `not`
dropped, a number moved (an int by one, a float doubled, 0.0 to 1.0) or a truth value flipped, an `if`
whose branch is never taken, and a statement that assigns or calls dropped; the modules' own constants
(LEASE_SECONDS and the like) are moved too. Log calls, messages and assertions are left alone: they
decide nothing. Each mutant is named by its module, function, kind and rank within the function
(`role.RoleManager.refused:drop#1`), which stays put while code elsewhere changes.

Each mutant runs only the unit tests that reach one of its lines (a line tracer over one run of the unit
tests finds them), in a child forked from a worker that has imported the third-party libraries already:
about a second a mutant, rather than the suite's half minute. A mutant no test reaches survives at once.
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import select
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

SWEPT = ("cluster", "authority", "member", "role", "keeper", "peers", "congestion", "competition", "poller", "flowsync", "portjobs", "policy", "plan")
SWAP: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                          ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
QUIET = ("LOG", "logging")          # calls on these decide nothing: never dropped, their arguments never mutated
PRELOAD = ("pytest", "os_ken.ofproto.ofproto_v1_3_parser", "yaml", "hypothesis", "prometheus_client", "ovs",
           "eventlet", "webob", "ovsdbapp")


@dataclass(frozen=True)
class Generated:
    name: str          # module.function:kind#rank
    path: str
    start: int         # byte offsets of the text replaced
    end: int
    old: str
    new: str
    lines: tuple[int, ...]
    anywhere: bool = False   # a module's or a class's constant: read wherever the module is used, even by no line of it

    @property
    def shown(self) -> str:
        old, new = (" ".join(t.split()) for t in (self.old, self.new))
        return f"{self.path}:{self.lines[0]}: {old[:60]} → {new[:60]}"

    def apply(self, text: str) -> str | None:
        """The file's text mutated, or None if the text at the place is no longer the one to mutate."""
        data = text.encode()
        if data[self.start:self.end].decode() != self.old:
            return None
        return (data[:self.start] + self.new.encode() + data[self.end:]).decode()


def generate(root: Path, modules: tuple[str, ...] = SWEPT) -> list[Generated]:
    found = []
    for module in modules:
        path = f"controller/core/{module}.py"
        found += _Walker(module, path, (root / path).read_text()).mutants
    return found


class _Walker:
    def __init__(self, module: str, path: str, text: str):
        self.module, self.path, self.data = module, path, text.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.mutants: list[Generated] = []
        self.ranks: dict[str, int] = defaultdict(int)
        tree = ast.parse(text)
        for owner, body in [(module, tree.body)] + [(f"{module}.{c.name}", c.body) for c in tree.body
                                                     if isinstance(c, ast.ClassDef)]:
            for node in body:   # constants (LEASE_SECONDS = 3.0) and defaults (utilisation: float = 0.9)
                if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                    self._constant(node.value, owner, anywhere=True)
        for scope, fn in _functions(tree):
            self._function(f"{module}.{scope}", fn)

    def _function(self, where: str, fn: ast.FunctionDef) -> None:
        body = fn.body[1:] if ast.get_docstring(fn) else fn.body
        for node in _nodes(body):
            if isinstance(node, ast.Compare):
                for i, op in enumerate(node.ops):
                    if type(op) in SWAP:
                        ops = [*node.ops]
                        ops[i] = SWAP[type(op)]()
                        self._add(where, "cmp", node, f"({ast.unparse(ast.Compare(node.left, ops, node.comparators))})")
            elif isinstance(node, ast.BoolOp):
                other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
                self._add(where, "bool", node, f"({ast.unparse(ast.BoolOp(other, node.values))})")
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                self._add(where, "not", node, f"({ast.unparse(node.operand)})")
            elif isinstance(node, ast.Constant):
                self._constant(node, where)
            elif isinstance(node, ast.If):
                self._add(where, "if", node.test, "False")
            elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Expr) and _droppable(node):
                self._add(where, "drop", node, "pass")

    def _constant(self, node: ast.Constant, where: str, anywhere: bool = False) -> None:
        value = node.value
        if isinstance(value, bool):
            self._add(where, "const", node, repr(not value), anywhere)
        elif isinstance(value, int):
            self._add(where, "const", node, repr(value + 1), anywhere)
        elif isinstance(value, float):
            self._add(where, "const", node, repr(value * 2 if value else 1.0), anywhere)

    def _add(self, where: str, kind: str, node: ast.expr | ast.stmt, new: str, anywhere: bool = False) -> None:
        assert node.end_lineno is not None and node.end_col_offset is not None
        start = self.starts[node.lineno - 1] + node.col_offset
        end = self.starts[node.end_lineno - 1] + node.end_col_offset
        self.ranks[f"{where}:{kind}"] += 1
        self.mutants.append(Generated(f"{where}:{kind}#{self.ranks[f'{where}:{kind}']}", self.path, start, end,
                                      self.data[start:end].decode(), new,
                                      tuple(range(node.lineno, node.end_lineno + 1)), anywhere))


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def _nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of a function's body but what decides nothing: log calls, messages, assertions, nested defs."""
    todo: list[ast.AST] = list(reversed(body))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Assert | ast.JoinedStr | ast.FunctionDef | ast.Lambda) or _quiet(node) or \
                isinstance(node, ast.Raise):
            continue
        yield node
        todo.extend(reversed(list(ast.iter_child_nodes(node))))


def _quiet(node: ast.AST) -> bool:
    if isinstance(node, ast.Expr):
        node = node.value
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in QUIET


def _droppable(node: ast.stmt) -> bool:
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Call)
    return not isinstance(node, ast.AnnAssign) or node.value is not None


# --- which tests reach which line ---------------------------------------------------------------------------

class LineMap:
    """A pytest plugin: the tests that run each line of the swept modules."""

    def __init__(self, files: set[str]):
        self.files = files
        self.test, self.started = "", 0.0
        self.reached: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.test, self.started = nodeid, time.monotonic()
        sys.settrace(self._call)
        threading.settrace(self._call)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        sys.settrace(None)
        threading.settrace(None)
        self.seconds[nodeid] = time.monotonic() - self.started

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._line if frame.f_code.co_filename in self.files else None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.reached[frame.f_code.co_filename][frame.f_lineno].add(self.test)
        return self._line


def trace(work: Path, out: Path) -> int:
    """Run the unit tests in `work` under the line map; write {path: {line: [tests]}} and each test's seconds to
    `out`; their exit code."""
    import pytest
    os.chdir(work)      # its pytest.ini puts the copy first on the path (pythonpath = .)
    files = {str(work / f"controller/core/{m}.py") for m in SWEPT}
    plugin = LineMap(files)
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "tests/unit"], plugins=[plugin])
    reached = {str(Path(f).relative_to(work)): {line: sorted(tests) for line, tests in lines.items()}
               for f, lines in plugin.reached.items()}
    out.write_text(json.dumps({"reached": reached, "seconds": plugin.seconds}))
    return int(code)


def tests_for(mutant: Generated, traced: dict[str, Any]) -> list[str]:
    """The tests that reach the mutant's lines, the quickest first: the first that fails ends the run. A module's
    or a class's constant may be read where no line of the module runs (a dataclass's default, in the __init__
    the dataclass made), so every test is run against it."""
    lines = traced["reached"].get(mutant.path, {})
    if mutant.anywhere:
        found = set(traced["seconds"])
    else:
        found = {t for line in mutant.lines for t in lines.get(str(line), ())}
    return sorted(found, key=lambda t: (traced["seconds"].get(t, 0.0), t))


# --- a worker that forks a child per mutant -----------------------------------------------------------------

def serve(work: Path, timeout: float) -> None:
    """Read mutants (JSON lines: path, text, tests) on stdin; answer each with its outcome and seconds."""
    for name in PRELOAD:
        importlib.import_module(name)
    for plugin in importlib.metadata.entry_points(group="pytest11"):
        try:
            plugin.load()
        except Exception:   # noqa: BLE001, S112 - a plugin that cannot load here will not load in the child either
            continue
    import pytest
    for line in sys.stdin:
        job = json.loads(line)
        target = work / job["path"]
        original = target.read_text()
        target.write_text(job["text"])
        for cached in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            cached.unlink()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            sys.dont_write_bytecode = True
            os.chdir(work)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--timeout={timeout}",
                                *job["tests"]])
            os._exit(int(code))
        outcome = _wait(pid, timeout * 2)
        target.write_text(original)
        print(json.dumps([outcome, time.monotonic() - start]), flush=True)


def _wait(pid: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"
        select.select([], [], [], 0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "killed (hung)"
