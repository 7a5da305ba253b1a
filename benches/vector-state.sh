#!/usr/bin/env bash
# What keeping guest processes' vector state in the VMM costs `provm run`
# on PVM (kernel patch 0011: the guest kernel asks the VMM to save and
# load each process's whole XSAVE area at a switch, two exits per switch,
# so that it may preempt user code anywhere). ROUNDS runs (default 5) of
# each workload, on the tests' busybox image:
#   holders   two ymm_hold checkers at once (tests/data/ymm_hold.c), each
#             holding its pattern in YMM0-15 across 20 rounds of spinning
#             that the guest's ticks preempt
#   counters  two_counters 1000 long (tests/data/two_counters.c): two
#             processes computing without system calls, each until the
#             other has begun, which ends only where user code is
#             preempted
#   forks     a shell forking and execing /bin/true 100 times
# each as `provm run --timing` (the wall time of the whole command: the
# booted snapshot, cached first, restored, the guest's work, its
# power-off) and, the peer, the same programs natively on this host. From `provm blame` of each run: the exits at the
# vector-state ports and the VMM's time at them (KVM_GET/SET_XSAVE and
# the guest-memory copy; the world switch of each exit is the guest's
# time in blame), and that time's share of the run. Prints a table of
# medians (min-max).
#
#   benches/vector-state.sh [ROUNDS]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
provm="$repo/target/release/provm"
rounds="${1:-5}"
# shellcheck source=benches/timing.sh
source "$repo/benches/timing.sh"

cargo build --release -q --manifest-path "$repo/Cargo.toml"
image="$(tests_image vector_state)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for program in ymm_hold two_counters; do
  gcc -O2 -static -o "$work/$program" "$repo/tests/data/$program.c"
done

holders='ymm_hold 1 > /tmp/1 & ymm_hold 2 > /tmp/2; wait; cat /tmp/1 /tmp/2'
counters='two_counters 1000 long'
forks='for i in $(seq 100); do /bin/true; done'

# guest WORKLOAD: one `provm run` of it, timed; its blame's vector-state
# exits and VMM nanoseconds are appended to $work/WORKLOAD.blame.
guest() {
  local script="${!1}" elapsed
  rm -f "$work/timing"
  elapsed="$(seconds "$provm" run --timing "$work/timing" "$image" -- /bin/sh -c "$script")"
  "$provm" blame --format csv "$work/timing" | awk -F, -v elapsed="$elapsed" '
    NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "exits:vector-state") e = i; if ($i == "vmm_ns:vector-state") t = i } next }
    { exits += $e; ns += $t }
    END { printf "%d %d %s\n", exits, ns, elapsed }' >>"$work/$1.blame"
  echo "$elapsed"
}

# native WORKLOAD: the same programs on this host.
native() {
  local script="${!1}"
  seconds env PATH="$work:$PATH" TMPDIR="$work" /bin/sh -c "${script//\/tmp\//$work/}"
}

"$provm" run "$image" -- true >/dev/null 2>&1
echo "| PVM, provm run, $rounds runs, median (min-max) | run (s) | native (s) | run / native | vector-state exits per run | VMM time at them (ms) | share of the run |"
echo "|---|---|---|---|---|---|---|"
for workload in holders counters forks; do
  runs="" natives=""
  for _ in $(seq "$rounds"); do
    runs+="$(guest "$workload")"$'\n'
    natives+="$(native "$workload")"$'\n'
  done
  run_median="$(printf '%s' "$runs" | median)"
  native_median="$(printf '%s' "$natives" | median)"
  exits="$(awk '{ print $1 }' "$work/$workload.blame" | summary)"
  vmm_ms="$(awk '{ print $2 / 1e6 }' "$work/$workload.blame" | summary)"
  share="$(awk '{ printf "%.4f\n", $2 / 1e9 / $3 }' "$work/$workload.blame" | median)"
  echo "| $workload | $(printf '%s' "$runs" | summary) | $(printf '%s' "$natives" | summary) |" \
    "$(echo "scale=1; $run_median / $native_median" | bc) | $exits | $vmm_ms |" \
    "$(awk -v s="$share" 'BEGIN { printf "%.2f%%", s * 100 }') |"
done
