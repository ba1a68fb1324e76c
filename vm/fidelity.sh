#!/bin/bash
# What this machine emulates faithfully, with plain netns + veth + tc (no OVS, no Mininet), as root.
# Meant for the VM:  python3 -m vm.harness --exec -- bash vm/fidelity.sh
# but it runs the same on any Linux host, for comparison. It prints a Markdown table:
#  - one TCP flow (iperf3, 10 s) through HTB at 5, 10 and 50 Mbit/s, achieved/configured. TCP
#    payload in Ethernet frames caps the ratio at 1448/1514 = 0.956, so the last column divides by it;
#  - a 12 Mbit/s UDP flood into 5 Mbit/s (UDP's ceiling: 1448/1490 = 0.972), as the study offers;
#  - the ping RTT with netem delay 5 ms each way, against the 10 ms configured, and without it.
set -euo pipefail
a=fid-a b=fid-b pidfile=/tmp/fid-iperf3.pid
cleanup() {
  if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
ip netns add "$a"
ip netns add "$b"
ip link add va netns "$a" type veth peer name vb netns "$b"
ip -n "$a" addr add 10.99.0.1/24 dev va
ip -n "$b" addr add 10.99.0.2/24 dev vb
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set va up
ip -n "$b" link set vb up
ip netns exec "$b" iperf3 -s -D -I "$pidfile"
sleep 1

# Receiver-side Mbit/s of one flow from a to b; extra arguments go to iperf3 (e.g. -u -b 12M).
flow() {
  ip netns exec "$a" iperf3 -c 10.99.0.2 -t 10 -J "$@" |
    python3 -c 'import json, sys; e = json.load(sys.stdin)["end"]
print("%.2f" % (e["sum_received"]["bits_per_second"] / 1e6))'
}
shape() {  # HTB on a's egress: one class, rate = ceil
  tc -n "$a" qdisc del dev va root 2>/dev/null || true   # HTB cannot be changed in place
  tc -n "$a" qdisc add dev va root handle 1: htb default 10
  tc -n "$a" class add dev va parent 1: classid 1:10 htb rate "${1}mbit" ceil "${1}mbit"
}
# Average ping RTT (ms) over 50 pings, 0.2 s apart.
rtt() { ip netns exec "$a" ping -q -c 50 -i 0.2 10.99.0.2 | sed -n 's|.*= [^/]*/\([^/]*\)/.*|\1|p'; }
row() {  # TEST CONFIGURED ACHIEVED UNIT [PAYLOAD_CEILING]; CONFIGURED 0 means none
  awk -v t="$1" -v c="$2" -v g="$3" -v u="$4" -v k="${5:-0}" 'BEGIN {
    conf = "–"; ratio = "–"; ceil = "–"
    if (c > 0) { conf = c " " u; ratio = sprintf("%.3f", g / c) }
    if (c > 0 && u == "ms") ratio = ratio sprintf(" (%+.2f ms)", g - c)
    if (k > 0) ceil = sprintf("%.3f", g / c / k)
    printf "| %s | %s | %s %s | %s | %s |\n", t, conf, g, u, ratio, ceil
  }'
}

echo "kernel $(uname -r), $(nproc) CPUs, TCP $(cat /proc/sys/net/ipv4/tcp_congestion_control)"
echo
echo "| test | configured | achieved | achieved/configured | of the payload ceiling |"
echo "|---|---:|---:|---:|---:|"
row "TCP, unshaped" 0 "$(flow)" Mbit/s
for rate in 5 10 50; do
  shape "$rate"
  row "TCP through HTB" "$rate" "$(flow)" Mbit/s 0.956
done
shape 5
row "UDP 12 Mbit/s offered into HTB" 5 "$(flow -u -b 12M)" Mbit/s 0.972
tc -n "$a" qdisc del dev va root
row "ping RTT, no netem" 0 "$(rtt)" ms
if tc -n "$a" qdisc add dev va root netem delay 5ms 2>/dev/null; then
  tc -n "$b" qdisc add dev vb root netem delay 5ms
  row "ping RTT, netem delay 5 ms each way" 10 "$(rtt)" ms
else
  echo "| ping RTT, netem delay 5 ms each way | 10 ms | netem absent | – | – |"
fi
