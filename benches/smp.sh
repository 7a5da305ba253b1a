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
# PROVM_BENCH_CPUS (default "1 2 4") chooses the vCPU counts,
# PROVM_BENCH_MODES (default "run parallel record replay") what is
# measured: `run --serial`, `run` (its vCPUs side by side), `record`,
# `replay`; PROVM_BENCH_SVM=0 skips the SVM test bed. In the test bed
# every run takes about 20 s (TCG): the L1 guest gets 90 minutes.
# serial:   four subshells one after the other, each counting to 100000
#           in a shell loop (user code, no system calls while it counts);
# parallel: the same four at once;
# forks:    four subshells at once, each forking and execing /bin/true 10
#           times (kernel work), measured if PROVM_BENCH_WORKLOADS (default
#           "serial parallel") names it.
# record, replay and `run --serial` run one vCPU at a time, switching at
# exits (docs/smp.md), so a guest of N vCPUs does its work no faster than
# one of one: what N costs is the switches, the IPIs and the SMP kernel.
# `run` runs them side by side, each on a host thread.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
provm="$repo/target/release/provm"
rounds="${1:-5}"
count='i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done'
serial="for r in 1 2 3 4; do ($count); done"
parallel="for r in 1 2 3 4; do ($count) & done; wait"
forks="for r in 1 2 3 4; do (for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done) & done; wait"

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
    for name in ${PROVM_BENCH_WORKLOADS:-serial parallel}; do
      script="${!name}"
      trace="$scratch/$name-$cpus.provm"
      for mode in ${PROVM_BENCH_MODES:-run parallel record replay}; do
        case "$mode" in
          run) timed "$provm" run --serial --cpus "$cpus" "$image" -- /bin/sh -c "$script" ;;
          parallel) timed "$provm" run --cpus "$cpus" "$image" -- /bin/sh -c "$script" ;;
          record) timed "$provm" record --force --cpus "$cpus" -o "$trace" "$image" -- /bin/sh -c "$script" ;;
          replay) timed "$provm" replay "$trace" ;;
        esac | result "$host" "$cpus" "$name" "$mode"
      done
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
if [ "${PROVM_BENCH_SVM:-1}" != 0 ]; then
  l1_out="$(mktemp -d "$work/l1-XXXXXX")"
  PROVM_SVM_TESTBED_OUT="$l1_out" PROVM_SVM_TESTBED_TIMEOUT="${PROVM_SVM_TESTBED_TIMEOUT:-5400}" \
    "$repo/scripts/svm-testbed" run --kernel 6.12 -- \
    env PROVM_BENCH_CPUS="${PROVM_BENCH_CPUS:-1 2 4}" PROVM_BENCH_MODES="${PROVM_BENCH_MODES:-}" \
    PROVM_BENCH_WORKLOADS="${PROVM_BENCH_WORKLOADS:-}" \
    bash "$repo/benches/smp.sh" --inside svm6.12 "$rounds" "$work/image.raw"
  cat "$l1_out/results" >>"$results"
  rm -rf "$l1_out"
fi
echo "Seconds, median (min-max) of $rounds; run: --serial; parallel: run with"
echo "the vCPUs side by side; ratios: of the medians (empty: not measured)."
echo
echo "| host | vCPUs | workload | run | parallel | record | replay | record/run | parallel/run |"
echo "|---|---|---|---|---|---|---|---|---|"
while IFS='|' read -r host cpus name; do
  cell() { grep "^$host|$cpus|$name|$1|" "$results" | cut -d'|' -f"$2"; }
  ratio() {
    [ -n "$(cell "$1" 6)" ] && [ -n "$(cell run 6)" ] || return 0
    echo "$(echo "scale=2; $(cell "$1" 6) / $(cell run 6)" | bc)x"
  }
  echo "| $host | $cpus | $name | $(cell run 5) | $(cell parallel 5) | $(cell record 5) | $(cell replay 5) | $(ratio record) | $(ratio parallel) |"
done < <(cut -d'|' -f1-3 "$results" | uniq)
