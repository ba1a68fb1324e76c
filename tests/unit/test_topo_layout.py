"""The launcher's shape (docs/layout.md): the network under a study (topo/net) needs nothing of what runs
beside it (topo/harness), and no file finds a package by editing sys.path."""
from __future__ import annotations

import ast
import subprocess
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



def test_no_file_edits_sys_path_to_find_a_package():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    editing = [name for name in tracked.stdout.split() if (ROOT / name).is_file()   # not one deleted, yet to commit
               and "sys.path.insert" in (ROOT / name).read_text() and name != "tests/unit/test_topo_layout.py"]
    assert not editing, editing


def test_the_launcher_runs_this_checkout_from_any_folder(tmp_path):
    """`python3 topo/run.py` from elsewhere, even from a folder with a `topo` of its own: this checkout's."""
    (tmp_path / "topo").mkdir()
    (tmp_path / "topo" / "__init__.py").write_text("raise SystemExit('the wrong topo')\n")
    done = subprocess.run(["/usr/bin/python3", str(ROOT / "topo" / "run.py"), "report"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.splitlines()[-1]) == \
        (2, "topo/run.py report: error: the following arguments are required: RESULTS_DIR"), done.stderr
