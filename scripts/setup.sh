#!/usr/bin/env bash
# Everything the study and the tests need on a fresh Debian 12 machine, as root. Idempotent:
# a second run installs nothing and restarts nothing that is already right.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(openvswitch-switch mininet iperf3 prometheus ethtool iproute2 iputils-ping
          python3-venv python3-pip docker-compose qemu-system-x86 debootstrap)
WMEM=8388608   # docs/datapath.md (one full queue can stall every port): set before ovs-vswitchd starts

say() { echo "setup: $*"; }
[ "$(id -u)" -eq 0 ] || { echo "setup: run as root (apt, sysctl and Open vSwitch need it)" >&2; exit 2; }

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq
  # policy-rc.d keeps packages from starting their own daemons (prometheus on :9090); we start what we need.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d; trap - EXIT
fi

before=$(cat /proc/sys/net/core/wmem_default)
echo "net.core.wmem_default = $WMEM" > /etc/sysctl.d/60-ovs-qos-controller.conf
sysctl -q -w net.core.wmem_default=$WMEM
if ! ovs-vsctl --timeout=5 show >/dev/null 2>&1 || ! ovs-appctl --timeout=5 version >/dev/null 2>&1; then
  say "starting Open vSwitch"
  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null 2>&1
elif [ "$before" -lt "$WMEM" ]; then
  say "restarting Open vSwitch so its datapath socket gets the larger send buffer"
  /usr/share/openvswitch/scripts/ovs-ctl restart --system-id=random >/dev/null 2>&1
fi
ovs-vsctl --timeout=10 show >/dev/null

if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.requirements.sha256
if ! sha256sum --status -c "$stamp" 2>/dev/null; then
  say "installing Python requirements"
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  sha256sum requirements.txt > "$stamp"
fi
.venv/bin/python -c "import mininet.net, os_ken, ovsdbapp, prometheus_client" 2>/dev/null \
  || { echo "setup: the venv cannot import its packages; remove .venv and run again" >&2; exit 1; }
say "ready"
