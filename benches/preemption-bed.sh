#!/usr/bin/env bash
# The cost of `record --preempt` on the SVM test bed (scripts/svm-testbed:
# L1 under QEMU's TCG, SVM KVM inside, where guest user code can be
# preempted; PVM preempts only its kernel, so there these workloads either
# run one process after the other or wait for ever), PROVM_PREEMPT_RUNS
# times (default 5) each workload:
#   spin      a thread spinning on a flag that another sets
#             (tests/data/spin_flag.c), `--preempt 5`: a loop that never
#             ends by itself
#   alone     one process computing without system calls (busybox sh
#             counting to 20,000), `--preempt 5 --preempt-computations`
#   counters  two such processes, each until the other has begun
#             (tests/data/two_counters.c, 10,000 long passes), the same
# each as
#   run       `provm run`, the peer: a live run preempts at any
#             instruction and replays nothing
#   record    `provm record` with the workload's options
#   replay    `provm replay` of that trace, which finds each preemption by
#             its state with a hardware breakpoint (after a free run, for
#             a computation's)
# and prints a table of medians (min-max) in seconds, the ratios of the
# medians, the preemptions per trace and, for computations, how many the
# replay found among the first passes from the stretch's start and the
# breakpoint stops per preemption it found after a free run, all from one
# L1 boot.
#
#   benches/preemption-bed.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
# shellcheck source=benches/timing.sh
source "$repo/benches/timing.sh"
runs="${PROVM_PREEMPT_RUNS:-5}"
cargo build --release -q --manifest-path "$repo/Cargo.toml"
# The tests' busybox image, with /bin/spin_flag and /bin/two_counters,
# built by the test suite.
image="$(tests_image preemption)"
job=$(cat <<JOB
P=$repo/target/release/provm; IMAGE=$image; RUNS=$runs
JOB
)
job+=$(cat <<'JOB'

# seconds COMMAND...: its time; if it fails, that and the last lines it
# wrote other than the late search's debug log (why: a replay's verdict
# goes to stdout, its errors to stderr).
seconds() {
  start=$(date +%s.%N)
  "$@" >/tmp/stdout 2>/tmp/stderr || {
    echo "BENCH failed: $*"
    cat /tmp/stdout /tmp/stderr | grep -v 'DEBUG' | tail -n 5 | cut -c1-300 | sed 's/^/BENCH why: /'
  }
  end=$(date +%s.%N)
  awk "BEGIN { print $end - $start }"
}
# measure NAME OPTIONS COMMAND...: one run, record and replay.
measure() {
  name=$1 options=$2
  shift 2
  echo "BENCH $name run $(seconds "$P" run "$IMAGE" -- "$@")"
  rm -f /tmp/w.provm
  echo "BENCH $name record $(seconds "$P" record -o /tmp/w.provm $options "$IMAGE" -- "$@")"
  export PROVM_LOG=provm_vmm::vm::late_arming=debug
  echo "BENCH $name replay $(seconds "$P" replay /tmp/w.provm)"
  unset PROVM_LOG
  # `preemption N` (loops) and `timed preemption N` (computations).
  echo "BENCH $name preemptions $("$P" inspect /tmp/w.provm |
    awk '$1 == "preemption" { n += $2 } $1 == "timed" && $2 == "preemption" { n += $3 } END { print n + 0 }')"
  echo "BENCH $name first_passes $(grep -c 'preemption found among the first passes' /tmp/stderr || true)"
  found=$(grep -c 'preemption found after a free run' /tmp/stderr || true)
  if [ "$found" -gt 0 ]; then
    stops=$(sed -n 's/.*preemption found after a free run of [0-9]*% and \([0-9]*\) breakpoint stops.*/\1/p' /tmp/stderr |
      awk '{ s += $1 } END { print s }')
    echo "BENCH $name stops_per_found $(awk "BEGIN { print $stops / $found }")"
    echo "BENCH $name rollbacks $(grep -c 'late arming: rolled back' /tmp/stderr || true)"
  fi
}
"$P" run "$IMAGE" -- true >/dev/null 2>&1
i=0
while [ $i -lt $RUNS ]; do
  i=$((i + 1))
  measure spin "--preempt 5" /bin/spin_flag
  measure alone "--preempt 5 --preempt-computations" /bin/sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i + 1)); done'
  measure counters "--preempt 5 --preempt-computations" /bin/two_counters 10000 long
done
JOB
)
out="$("$repo/scripts/svm-testbed" run --kernel 6.12 -- /bin/sh -c "$job" 2>&1)"
# A failed step is counted, not timed (`failed` below), and fails the bench.
failed=0
if grep -q 'BENCH failed' <<<"$out"; then
  grep -E 'BENCH (failed|why)' <<<"$out" >&2
  failed=1
fi
# median (min-max) of the values of WORKLOAD KIND, the failed ones left out.
stats() {
  grep "^BENCH $1 $2 [0-9]" <<<"$out" | awk '{ print $4 }' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit }
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
      printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'
}
# (timing.sh's median takes numbers; this one a workload's kind.)
median_of() { stats "$1" "$2" | cut -d' ' -f1; }
ratio() { awk "BEGIN { printf \"%.2f\", $(median_of "$1" "$2") / $(median_of "$1" "$3") }"; }
echo "| SVM bed (Linux 6.12), $runs runs, median (min-max) | run (s) | record (s) | replay (s) | record / run | replay / record | preemptions | found among the first passes | stops per preemption found after a free run | rollbacks | failed |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for workload in spin alone counters; do
  echo "| $workload | $(stats $workload run) | $(stats $workload record) | $(stats $workload replay) |" \
    "$(ratio $workload record run) | $(ratio $workload replay record) | $(stats $workload preemptions) |" \
    "$(stats $workload first_passes) | $(stats $workload stops_per_found) | $(stats $workload rollbacks) |" \
    "$(grep -c "^BENCH $workload [a-z]* BENCH failed" <<<"$out") |"
done
exit "$failed"
