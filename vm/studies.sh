#!/bin/bash
# The studies this host's kernel cannot run, as vm/README.md reports them: run in the guest with
#   python3 -m vm.harness --exec -- bash vm/studies.sh [OUT]
# (the tables there came from these commands, run in three boots: results/vm-campaign{,2,3,4}).
set -x
cd "$(dirname "$0")/.."
OUT=${1:-results/vm-studies}
mkdir -p "$OUT"
python3 topo/run.py doctor > "$OUT/doctor.txt" 2>&1
for path in "15ms" "150ms" "15ms 1" "150ms 1"; do
  set -- $path
  tag=$1${2:+-loss$2}
  python3 topo/run.py cc --algorithms reno cubic bbr --seconds 30 --delay $1 ${2:+--loss $2} --out "$OUT/cc-$tag"
  python3 topo/run.py cc --seconds 15 --delay $1 ${2:+--loss $2} --out "$OUT/cc-all-$tag"
done
python3 topo/run.py aqm --quick --out "$OUT/aqm"
