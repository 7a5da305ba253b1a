#!/usr/bin/env bash
# Many CPUs (`--cpus N`): `provm run`, `record` and `replay` of guests with
# N = 1, 2 and 4 vCPUs, on a serial workload and a parallel one, on both
# KVM kinds (this machine's PVM and the SVM test bed's Linux 6.12), ROUNDS
# rounds each (default 5): median (min-max) seconds of wall time, from the
# snapshot's restore to power-off (each N's snapshot is made first, not
# measured), and record's median over run's with the same N.
#
#   benches/smp.sh [ROUNDS]
#
# PROVM_BENCH_CPUS (default "1 2 4") chooses the vCPU counts. In the test
# bed every run takes about 20 s (TCG): the L1 guest gets 90 minutes.
# serial:   four subshells one after the other, each counting to 100000
#           in a shell loop (user code, no system calls while it counts);
# parallel: the same four at once.
# provm runs one vCPU at a time, switching at exits (docs/smp.md), in run
# as in record, so a guest of N vCPUs does its work no faster than one of
# one: what N costs is the switches, the IPIs and the SMP kernel.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
provm="$repo/target/release/provm"
rounds="${1:-5}"
count='i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done'
serial="for r in 1 2 3 4; do ($count); done"
parallel="for r in 1 2 3 4; do ($count) & done; wait"

# shellcheck source=benches/timing.sh
source "$repo/benches/timing.sh"

# timed COMMAND...: $rounds wall times of COMMAND, a line each.
timed() {
  local i
  for i in $(seq "$rounds"); do seconds "$@"; done
}

# result HOST N WORKLOAD MODE: the line of the times on stdin.
result() {
  local values
  values="$(cat)"
  echo "$1|$2|$3|$4|$(summary <<<"$values")|$(median <<<"$values")"
}

# measure HOST IMAGE SCRATCH: one line per measurement,
# "HOST|N|WORKLOAD|MODE|median (min-max)|median". A subshell: its
# PROVM_CACHE stays its own.
measure() (
  local host="$1" image="$2" scratch="$3" cpus name script trace
  private_cache "$scratch/cache"
  for cpus in ${PROVM_BENCH_CPUS:-1 2 4}; do
    "$provm" run --cpus "$cpus" "$image" -- true >/dev/null 2>&1 ||
      { echo "smp.sh: the first run with --cpus $cpus failed" >&2; exit 1; }
    for name in serial parallel; do
      script="${!name}"
      trace="$scratch/$name-$cpus.provm"
      timed "$provm" run --cpus "$cpus" "$image" -- /bin/sh -c "$script" |
        result "$host" "$cpus" "$name" run
      timed "$provm" record --force --cpus "$cpus" -o "$trace" "$image" -- /bin/sh -c "$script" |
        result "$host" "$cpus" "$name" record
      timed "$provm" replay "$trace" | result "$host" "$cpus" "$name" replay
    done
  done
)

if [ "${1:-}" = --inside ]; then
  rounds="$3"
  out="${PROVM_SVM_TESTBED_OUT:?run by scripts/svm-testbed}"
  measure "$2" "$4" /tmp/bench >"$out/results"
  exit 0
fi

[ -x "$provm" ] || { echo "smp.sh: build provm first: cargo build --release" >&2; exit 1; }
work="$repo/target/bench-smp"
rm -rf "$work"
"$repo/scripts/busybox-image" "$work"
results="$work/results"
measure pvm "$work/image.raw" "$work/pvm" >"$results"
l1_out="$(mktemp -d "$work/l1-XXXXXX")"
PROVM_SVM_TESTBED_OUT="$l1_out" PROVM_SVM_TESTBED_TIMEOUT="${PROVM_SVM_TESTBED_TIMEOUT:-5400}" \
  "$repo/scripts/svm-testbed" run --kernel 6.12 -- \
  env PROVM_BENCH_CPUS="${PROVM_BENCH_CPUS:-1 2 4}" \
  bash "$repo/benches/smp.sh" --inside svm6.12 "$rounds" "$work/image.raw"
cat "$l1_out/results" >>"$results"
rm -rf "$l1_out"
echo "Seconds, median (min-max) of $rounds; record/run: the medians' ratio."
echo
echo "| host | vCPUs | workload | run | record | replay | record/run |"
echo "|---|---|---|---|---|---|---|"
while IFS='|' read -r host cpus name; do
  cell() { grep "^$host|$cpus|$name|$1|" "$results" | cut -d'|' -f"$2"; }
  ratio="$(echo "scale=2; $(cell record 6) / $(cell run 6)" | bc)"
  echo "| $host | $cpus | $name | $(cell run 5) | $(cell record 5) | $(cell replay 5) | ${ratio}x |"
done < <(cut -d'|' -f1-3 "$results" | uniq)
