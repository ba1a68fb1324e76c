#!/usr/bin/env bash
# The controller as a system service, as root:
#
#   scripts/install-service.sh                 install (again: updates the code, keeps config and state)
#   scripts/install-service.sh --uninstall     remove all of it: unit, code, venv, config, policies, state
#
# Installs the controller in /opt/ovs-qos-controller with a venv of its own (requirements/controller.txt),
# its config at /etc/ovs-qos-controller/qos.conf and the shipped policies in /etc/ovs-qos-controller/policies/,
# its state in /var/lib/ovs-qos-controller/, and the systemd unit ovs-qos-controller.service
# (docs/service.md). With systemd running, the unit is reloaded; `systemctl enable --now
# ovs-qos-controller` starts it. Stopping the service leaves flows and queues as they are.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=/opt/ovs-qos-controller
CONFIG=/etc/ovs-qos-controller
STATE=/var/lib/ovs-qos-controller
UNIT=/etc/systemd/system/ovs-qos-controller.service
ACTION=install

case ${1:-} in
  "") ;;
  --uninstall) ACTION=uninstall ;;
  *) echo "install-service: unknown argument $1; use --uninstall to remove the service, or nothing" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "install-service: run as root" >&2; exit 2; }
say() { echo "install-service: $*"; }
systemd_running() { [ -d /run/systemd/system ]; }

if [ "$ACTION" = uninstall ]; then
  if systemd_running; then
    systemctl disable --now ovs-qos-controller.service 2>/dev/null || true
  fi
  rm -f "$UNIT"
  rm -rf "$PREFIX" "$CONFIG" "$STATE"
  systemd_running && systemctl daemon-reload
  say "removed the unit, $PREFIX, $CONFIG and $STATE"
  exit 0
fi

say "installing into $PREFIX"
install -d -m 0755 "$PREFIX" "$CONFIG" "$CONFIG/policies" "$(dirname "$UNIT")"
install -d -m 0750 "$STATE"
# The code: a fresh copy each time (no stale module survives an update).
rm -rf "$PREFIX/controller" "$PREFIX/requirements" "$PREFIX/docs"
cp -r controller requirements "$PREFIX/"
install -d "$PREFIX/docs" && cp docs/service.md "$PREFIX/docs/"
find "$PREFIX/controller" -name __pycache__ -prune -exec rm -rf {} +
if [ ! -x "$PREFIX/venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$PREFIX/venv"
fi
"$PREFIX/venv/bin/pip" install -q --disable-pip-version-check -r "$PREFIX/requirements/controller.txt"
scripts/startup-hook.sh "$PREFIX/venv" "$PREFIX/controller/startup.py"
# The shipped policies, once: a reinstall adds new ones and leaves those there as they are; a config
# unless there is one.
for policy in policies/*.yaml policies/bases; do
  cp -rn "$policy" "$CONFIG/policies/"
done
if [ ! -e "$CONFIG/qos.conf" ]; then
  sed -e "s|^# state_file = .*|state_file = $STATE/default.json|" \
      -e "s|^# policy = policies/|# policy = $CONFIG/policies/|" controller/qos.conf > "$CONFIG/qos.conf"
  chmod 0640 "$CONFIG/qos.conf"
fi
sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@CONFIG@|$CONFIG|g" service/ovs-qos-controller.service > "$UNIT"
if systemd_running; then
  systemctl daemon-reload
  say "installed; start it with: systemctl enable --now ovs-qos-controller"
else
  say "installed; where systemd runs: systemctl enable --now ovs-qos-controller"
fi
