#!/usr/bin/env bash
# The ceiling of parallel vCPUs (issue 33, item 6), measured before building
# them: can two vCPUs' work run side by side on this host's KVM at all?
# Two one-vCPU guests side by side against the same two one after the
# other; and, for today's serialised vCPUs, one guest of 1 and of 2 vCPUs
# doing two workers' work. If two guests side by side are no quicker than
# one after the other, the vCPUs of one guest on two host threads cannot
# be either (they share the same host kernel and KVM, and more: one VM).
#
#   benches/parallel-ceiling.sh [ROUNDS]       (default 3)
#
# Workloads (busybox sh), per worker:
#   user:   a shell loop counting to $PROVM_CEILING_COUNT (default 200000),
#           user code without system calls;
#   kernel: $PROVM_CEILING_FORKS (default 40) fork and execs of /bin/true.
# Prints, per workload, median (min-max) wall seconds of provm run (boot
# from the cached snapshot to power-off), and its CPU seconds (user+system,
# both guests' for a pair).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
provm="$repo/target/release/provm"
rounds="${1:-3}"
count="${PROVM_CEILING_COUNT:-200000}"
forks="${PROVM_CEILING_FORKS:-40}"
user="i=0; while [ \$i -lt $count ]; do i=\$((i+1)); done"
kernel="for i in \$(seq $forks); do /bin/true; done"

# shellcheck source=benches/timing.sh
source "$repo/benches/timing.sh"

work="${PROVM_CEILING_WORK:-$repo/target/bench-ceiling}"
image="$work/image.raw"
if [ ! -f "$image" ]; then
  rm -rf "$work"
  "$repo/scripts/busybox-image" "$work" >/dev/null
fi
private_cache "$work/cache"
for cpus in 1 2; do
  "$provm" run --cpus "$cpus" "$image" -- true >/dev/null 2>&1 ||
    { echo "ceiling: the first run with --cpus $cpus failed" >&2; exit 1; }
done

# guest CPUS SCRIPT [CORE]: one guest, on host core CORE (default 0):
# on PVM provm keeps its vCPU thread on the first core it may use
# (vmm/src/host_core.rs), so guests side by side must be given different
# cores, or both run on the first. One guest, its wall seconds and its CPU seconds
# (user+system of provm), "wall cpu".
guest() {
  local out
  out="$(mktemp)"
  local start end
  start="$(date +%s.%N)"
  /usr/bin/time -f '%U %S' -o "$out" taskset -c "${3:-0}" "$provm" run --cpus "$1" "$image" -- /bin/sh -c "$2" >/dev/null 2>&1 ||
    { echo "ceiling: failed: run --cpus $1 $2" >&2; exit 1; }
  end="$(date +%s.%N)"
  echo "$(echo "$end - $start" | bc) $(awk '{ print $1 + $2 }' "$out")"
  rm -f "$out"
}

# pair SIDE_BY_SIDE: two one-vCPU guests of the workload $one, side by
# side (1) or one after the other (0); "wall cpu", the CPU of both.
pair() {
  local a b start end
  a="$(mktemp)" b="$(mktemp)"
  start="$(date +%s.%N)"
  if [ "$1" = 1 ]; then
    guest 1 "$one" 0 >"$a" & local first=$!
    guest 1 "$one" 1 >"$b"
    wait "$first"
  else
    guest 1 "$one" >"$a"
    guest 1 "$one" >"$b"
  fi
  end="$(date +%s.%N)"
  echo "$(echo "$end - $start" | bc) $(cat "$a" "$b" | awk '{ s += $2 } END { print s }')"
  rm -f "$a" "$b"
}

# row NAME: the wall and CPU columns of the "wall cpu" lines on stdin.
row() {
  local lines
  lines="$(cat)"
  printf '| %s | %s | %s |\n' "$1" "$(cut -d' ' -f1 <<<"$lines" | summary)" \
    "$(cut -d' ' -f2 <<<"$lines" | summary)"
}

for name in user kernel; do
  one="${!name}"
  two="($one) & ($one) & wait"
  echo "## $name: $one"
  echo
  echo "| how | wall s | CPU s |"
  echo "|---|---|---|"
  for _ in $(seq "$rounds"); do guest 1 "$one"; done | row "one guest, 1 vCPU, one worker"
  for _ in $(seq "$rounds"); do pair 1; done | row "two guests side by side, one worker each (both done)"
  for _ in $(seq "$rounds"); do pair 0; done | row "two guests one after the other"
  for _ in $(seq "$rounds"); do guest 1 "$two"; done | row "one guest, 1 vCPU, two workers"
  for _ in $(seq "$rounds"); do guest 2 "$two"; done | row "one guest, 2 vCPUs (serialised), two workers"
  echo
done
