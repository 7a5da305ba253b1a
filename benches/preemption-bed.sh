#!/usr/bin/env bash
# The cost of `record --preempt` on the SVM test bed (scripts/svm-testbed:
# L1 under QEMU's TCG, SVM KVM inside, where guest user code can be
# preempted; PVM preempts only its kernel): a thread spinning on a flag
# that another sets (tests/data/spin_flag.c), PROVM_PREEMPT_RUNS times
# (default 5) each:
#   run     `provm run`, the peer: a live run preempts at any instruction
#           and replays nothing
#   record  `provm record --preempt 5`, which preempts the spinner's loop
#   replay  `provm replay` of that trace, which finds each preemption by
#           its state with a hardware breakpoint
# and prints a table of medians (min-max) in seconds, the replay/record
# ratio and the preemptions per trace, all from one L1 boot.
#
#   benches/preemption-bed.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
runs="${PROVM_PREEMPT_RUNS:-5}"
cargo build --release -q --manifest-path "$repo/Cargo.toml"
# The tests' busybox image, with /bin/spin_flag, built by the test suite.
image="$(ls -t "$repo"/target/tmp/test-images/*/tiny.qcow2 2>/dev/null | head -n 1)"
[ -n "$image" ] || { echo "no test image: run cargo test --release --test suite preemption first" >&2; exit 1; }
job=$(cat <<JOB
P=$repo/target/release/provm; IMAGE=$image; RUNS=$runs
JOB
)
job+=$(cat <<'JOB'

seconds() { start=$(date +%s.%N); "$@" >/dev/null 2>&1 || echo "BENCH failed: $*"; end=$(date +%s.%N); awk "BEGIN { print $end - $start }"; }
"$P" run "$IMAGE" -- true >/dev/null 2>&1
i=0
while [ $i -lt $RUNS ]; do
  i=$((i + 1))
  echo "BENCH run $(seconds "$P" run "$IMAGE" -- /bin/spin_flag)"
  rm -f /tmp/spin.provm
  echo "BENCH record $(seconds "$P" record -o /tmp/spin.provm --preempt 5 "$IMAGE" -- /bin/spin_flag)"
  echo "BENCH replay $(seconds "$P" replay /tmp/spin.provm)"
  echo "BENCH preemptions $("$P" inspect /tmp/spin.provm | awk '$1 == "preemption" { print $2 }')"
done
JOB
)
out="$("$repo/scripts/svm-testbed" run --kernel 6.12 -- /bin/sh -c "$job" 2>&1)"
if grep -q 'BENCH failed' <<<"$out"; then
  grep 'BENCH failed' <<<"$out" >&2
  exit 1
fi
# median (min-max) of the values of KIND.
stats() {
  grep "^BENCH $1 " <<<"$out" | awk '{ print $3 }' | sort -n |
    awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
      printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'
}
median() { stats "$1" | cut -d' ' -f1; }
echo "| spin_flag on the SVM bed (Linux 6.12), $runs runs | seconds, median (min-max) |"
echo "|---|---|"
for kind in run record replay preemptions; do
  echo "| $kind | $(stats "$kind") |"
done
ratio() { awk "BEGIN { printf \"%.2f\", $(median "$1") / $(median "$2") }"; }
echo "| replay / record (medians) | $(ratio replay record) |"
echo "| record / run (medians) | $(ratio record run) |"
