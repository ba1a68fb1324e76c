#!/bin/bash
# The guest's init, run as PID 1 by the image's /sbin/ovsqos-init from the harness's control share
# (/run/ovsqos). It makes the guest what the studies need, runs the command with its output on
# ttyS1 (the host's stdout), leaves the exit code in /run/ovsqos/rc and powers off. Its own
# messages go to the console (ttyS0), which the harness keeps as the boot log and times.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
ctl=/run/ovsqos
say() { echo "ovsqos-vm: $*"; }
say init
# OVSQOS_VM, SHARES (tag:path), WORKDIR, COMMAND (array), OUTPUT (shell|tty|pipe): from vm/harness.py
source "$ctl/vm.env"
export OVSQOS_VM

mountpoint -q /dev/pts || { mkdir -p /dev/pts; mount -t devpts devpts /dev/pts; }   # Mininet's shells use ptys
mountpoint -q /dev/shm || { mkdir -p /dev/shm; mount -t tmpfs tmpfs /dev/shm; }
hostname ovsqos-vm
ip link set lo up   # the controller, OVSDB clients and Prometheus talk over loopback

# What the studies probe for (topo/run.py doctor), and every TCP congestion control the kernel ships.
modules=(openvswitch sch_htb sch_tbf sch_netem sch_red sch_sfq sch_codel sch_fq_codel sch_fq sch_prio sch_hfsc)
for ko in /lib/modules/"$(uname -r)"/kernel/net/ipv4/tcp_*.ko*; do
  ko=${ko##*/}; ko=${ko%%.ko*}
  [ "$ko" = tcp_diag ] || modules+=("$ko")   # socket monitoring, not a congestion control
done
for m in "${modules[@]}"; do modprobe "$m" || say "module $m did not load"; done
sysctl -qw net.core.wmem_default=8388608   # docs/datapath.md: before ovs-vswitchd starts

# The repository (and its venv, if that lives elsewhere) at the same absolute paths as on the host.
# cache=loose caches pages and metadata in the guest: Python imports take half the time under TCG,
# and mmap (Prometheus's TSDB) works. The price: edits made on the host during a run may go unseen.
for share in "${SHARES[@]}"; do
  mkdir -p "${share#*:}"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose "${share%%:*}" "${share#*:}" \
    || say "could not mount ${share#*:}"
done

/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null 2>&1 || say "ovs-ctl start failed"
say ready

cd "$WORKDIR"
[ "$OUTPUT" = shell ] || stty -F /dev/ttyS1 raw -echo   # bytes as written: the host's terminal adds \r
case $OUTPUT in
  shell) TERM=linux setsid -c -w "${COMMAND[@]}" <>/dev/ttyS1 >&0 2>&0 ;;   # ttyS1 as its terminal
  tty) "${COMMAND[@]}" </dev/null >/dev/ttyS1 2>&1 ;;
  # The host's stdout is a file or a pipe: so is the command's, as on the host (no progress bars).
  pipe) "${COMMAND[@]}" </dev/null 2>&1 | cat >/dev/ttyS1; (exit "${PIPESTATUS[0]}") ;;
esac
echo $? > "$ctl/rc"
sync   # writes the command's files (results/) back through 9p
echo o > /proc/sysrq-trigger   # power off; QEMU exits
sleep 60
