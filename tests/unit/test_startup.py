"""controller/startup.py, which both managers run first: the app they load by its path brings its own
checkout's `controller` package, whatever is on the path (a venv may be shared by several checkouts)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_app_on_a_managers_command_line_brings_its_own_package(tmp_path):
    # A stand-in for the manager, named like it; -S: no site, so no venv's start-up hook and nothing else on
    # the path (the script's folder is first: a `controller` there would be the wrong one).
    (tmp_path / "controller").mkdir()
    (tmp_path / "controller" / "__init__.py").write_text("raise SystemExit('the wrong controller')\n")
    manager = tmp_path / "ryu-manager"
    manager.write_text(f"import runpy\nrunpy.run_path({str(ROOT / 'controller' / 'startup.py')!r})\n"
                       "import controller.core.errors\nprint(controller.core.errors.__file__)\n")
    done = subprocess.run([sys.executable, "-S", str(manager), "--config-file", "qos.conf",
                           str(ROOT / "controller" / "qos_app.py")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert done.stdout.strip() == str(ROOT / "controller" / "core" / "errors.py"), done.stderr
