"""Run at the start of osken-manager and ryu-manager only (by the venv's ovs_qos_startup.pth, which
scripts/setup.sh writes), before either imports eventlet: what they print at every start before an app is
loaded goes, so that a bad config is the one line the app prints. Under os-ken, eventlet's deprecation
banner (ten lines) is filtered, and eventlet is patched in here, before any lock exists, so that none is
left un-greened (it says so in a line otherwise). Ryu's older eventlet has no banner, and needs the
system's packages, not on the path this early. Both managers' "loading app" lines are kept below WARNING."""
import logging
import sys
import warnings

if sys.orig_argv[1:2] and sys.orig_argv[1].endswith("osken-manager"):   # runpy has replaced argv[0]
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    import eventlet
    eventlet.monkey_patch()

for _name in ("os_ken.base.app_manager", "ryu.base.app_manager"):
    logging.getLogger(_name).setLevel(logging.WARNING)
