#!/usr/bin/env bash
# Everything the study and the tests need on a fresh Debian 12 machine, as root. Idempotent:
# a second run installs nothing and restarts nothing that is already right.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(openvswitch-switch mininet iperf3 irtt prometheus ethtool iproute2 iputils-ping
          python3-venv python3-pip docker-compose qemu-system-x86 debootstrap
          podman runc   # the controller's image (scripts/build-image.sh): runc, as crun refuses cgroup v1+v2 hosts
          sudo python-is-python3 systemd   # `sudo python topo/run.py`; systemd-analyze checks the service unit
          etcd-server)                     # a cluster's coordination; tests start their own (not the service)
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
  # Debian enables an irtt server on every address at boot; the study starts its own inside Mininet hosts.
  if [[ " ${missing[*]} " == *" irtt "* ]]; then
    systemctl disable irtt.service >/dev/null 2>&1 || true
  fi
  # Likewise etcd on :2379: a cluster names the etcd its members share; tests start their own.
  if [[ " ${missing[*]} " == *" etcd-server "* ]]; then
    systemctl disable etcd.service >/dev/null 2>&1 || true
  fi
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

# venv DIR REQUIREMENTS: make DIR (with the system's packages, for Debian's Mininet) and install what
# REQUIREMENTS pins, unless the pins are what was installed last time.
venv() {
  local dir=$1 reqs=$2 stamp=$1/.requirements.sha256 sum
  [ -x "$dir/bin/python" ] || { say "creating $dir"; /usr/bin/python3 -m venv --system-site-packages "$dir"; }
  sum=$(cat "$reqs" requirements/*.txt | sha256sum)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    say "installing $reqs into $dir"
    "$dir/bin/pip" install -q --disable-pip-version-check -r "$reqs"
    echo "$sum" > "$stamp"
  fi
}
venv .venv requirements.txt
venv .venv-ryu requirements/ryu.txt    # Ryu's eventlet pin clashes with os-ken's: a venv of its own
for dir in .venv .venv-ryu; do scripts/startup-hook.sh "$dir" "$PWD/controller/startup.py"; done
.venv/bin/python -c "import mininet.net, os_ken, ovsdbapp, prometheus_client" 2>/dev/null \
  || { echo "setup: .venv cannot import its packages; remove it and run again" >&2; exit 1; }
.venv-ryu/bin/ryu-manager --version >/dev/null 2>&1 \
  || { echo "setup: .venv-ryu's ryu-manager does not start; remove .venv-ryu and run again" >&2; exit 1; }
# The commands as users type them: ryu-manager and osken-manager on PATH, running this checkout's venvs.
ln -sfn "$PWD/.venv-ryu/bin/ryu-manager" /usr/local/bin/ryu-manager
ln -sfn "$PWD/.venv/bin/osken-manager" /usr/local/bin/osken-manager
say "ready"
