"""Run at the start of osken-manager and ryu-manager only (by the venv's ovs_qos_startup.pth, which
scripts/setup.sh writes), before either imports eventlet: what they print at every start before an app is
loaded goes, so that a bad config is the one line the app prints. Under os-ken, eventlet's deprecation
banner (ten lines) is filtered, and eventlet is patched in here, before any lock exists, so that none is
left un-greened (it says so in a line otherwise). Ryu's older eventlet has no banner, and needs the
system's packages, not on the path this early. Both managers' "loading app" lines are kept below WARNING.

The managers load the app by its path (`osken-manager ... controller/qos_app.py`), as a module of no
package; its `controller.*` imports are found because its folder is registered here as the package
`controller`, so the app and the package are always one checkout's (checkouts may share a venv)."""
import importlib.util
import logging
import sys
import warnings
from pathlib import Path


def _register(app: Path) -> None:
    """`app`'s folder imported as the package `controller`: its modules are found there, by its __path__."""
    folder = app.resolve().parent
    spec = importlib.util.spec_from_file_location("controller", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None, folder
    sys.modules["controller"] = package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)


_app = next((Path(a) for a in sys.orig_argv[2:] if a.endswith("qos_app.py") and Path(a).is_file()), None)
if _app is not None:
    _register(_app)

if sys.orig_argv[1:2] and sys.orig_argv[1].endswith("osken-manager"):   # runpy has replaced argv[0]
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    import eventlet
    eventlet.monkey_patch()

for _name in ("os_ken.base.app_manager", "ryu.base.app_manager"):
    logging.getLogger(_name).setLevel(logging.WARNING)
