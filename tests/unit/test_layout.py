"""The shape the core keeps (docs/layout.md): pure, no module reaching back to the controller that owns
it, classes small enough to hold one concern (the adapters' too), and the app a thin shim."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "controller" / "core"
ADAPTERS = ROOT / "controller" / "adapters"
MAX_METHODS, MAX_FIELDS, MAX_APP_LINES = 20, 15, 400
# Adapters' classes still over the rule, each to be split (issue 46): none may join, and one that comes under it
# leaves the list.
OVER_THE_RULE = {"ovsdb.Ovsdb"}


def _imports(tree: ast.Module) -> set[str]:
    """Every module a file imports, under TYPE_CHECKING too."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _modules(directory: Path = CORE) -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(directory.glob("*.py"))}


def _sizes(directory: Path) -> dict[str, tuple[int, int]]:
    """Each class of the directory's modules: its methods and the fields its methods set."""
    sizes = {}
    for name, tree in _modules(directory).items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
            fields = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                      and isinstance(n.value, ast.Name) and n.value.id == "self"}
            fields |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            sizes[f"{name}.{cls.name}"] = (len(methods), len(fields))
    return sizes


def test_the_core_imports_only_the_standard_library_and_itself():
    allowed = set(sys.stdlib_module_names) | {"controller", "yaml"}   # YAML: a parser, no I/O of its own
    for name, tree in _modules().items():
        foreign = {m for m in _imports(tree) if m.split(".")[0] not in allowed}
        assert not foreign, f"controller/core/{name}.py imports {sorted(foreign)}"


def test_no_module_of_the_core_reaches_back_to_the_controller():
    for name, tree in _modules().items():
        if name != "controller":
            assert "controller.core.controller" not in _imports(tree), f"controller/core/{name}.py"


def test_every_class_of_the_core_holds_one_concern():
    for name, (methods, fields) in _sizes(CORE).items():
        assert methods <= MAX_METHODS, f"{name}: {methods} methods"
        assert fields <= MAX_FIELDS, f"{name}: {fields} fields"


def test_every_class_of_the_adapters_holds_one_concern():
    over = {name for name, (methods, fields) in _sizes(ADAPTERS).items()
            if methods > MAX_METHODS or fields > MAX_FIELDS}
    assert over == OVER_THE_RULE, f"over {MAX_METHODS} methods or {MAX_FIELDS} fields: {sorted(over)}"


def test_the_app_is_a_thin_shim():
    lines = len((ROOT / "controller" / "qos_app.py").read_text().splitlines())
    assert lines <= MAX_APP_LINES, f"controller/qos_app.py: {lines} lines"


def test_the_controller_and_the_app_ask_their_authority_never_which_one_it_is():
    """Alone, one of a pair or a cluster's member is chosen once at start (controller/adapters/ha.py), and the
    core asks it through one interface (controller/core/ha.py): neither the controller, nor what it holds of
    its switches, nor the app names the cluster, the coordination or the standby flag."""
    chosen = {"cluster", "Cluster", "coordination", "Coordination", "standby", "member", "Member", "Pair"}
    for path in (CORE / "controller.py", CORE / "held.py", ROOT / "controller" / "qos_app.py"):
        tree = ast.parse(path.read_text())
        named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
            {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names}
        assert not named & chosen, f"{path.relative_to(ROOT)} names {sorted(named & chosen)}"
