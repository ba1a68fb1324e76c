"""The launcher's shape (docs/layout.md): the network under a study (topo/net) needs nothing of what runs
beside it (topo/harness)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_network_imports_nothing_of_the_harness():
    for path in sorted((ROOT / "topo" / "net").glob("*.py")):
        reached = {m for m in _imports(path) if m == "topo.harness" or m.startswith("topo.harness.")}
        assert not reached, f"{path.relative_to(ROOT)} imports {sorted(reached)}"

