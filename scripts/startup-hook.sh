#!/bin/sh
# startup-hook.sh VENV STARTUP: VENV's osken-manager and ryu-manager run STARTUP (controller/startup.py) before
# anything else, through a .pth file in the venv's site-packages; run again, it writes the same file.
set -eu
purelib=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "import sys; sys.argv[0].endswith(('osken-manager', 'ryu-manager')) and __import__('runpy').run_path('$2')" \
  > "$purelib/ovs_qos_startup.pth"
