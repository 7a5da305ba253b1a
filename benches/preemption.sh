#!/usr/bin/env bash
# What `record --preempt 5 --preempt-computations` costs on this host's
# own KVM, against `provm run` (the peer: a live run preempts anywhere and
# replays nothing), ROUNDS runs (default 5) of each workload:
#   spin    a thread spinning on a flag that another sets after computing
#           (tests/data/spin_flag.c): a loop that never ends by itself,
#           preempted in user mode on every host
#   alone   one process computing without system calls (busybox sh
#           counting to 20,000, on the tests' busybox image)
#   python  two CPU-bound threads of pure Python, each counting to
#           3,000,000 (tests/data/python_threads.py, the held-out suite's
#           kind of program), on scripts/debian-image's image
# each as run, record and the replay of that trace. Prints medians
# (min-max) in seconds, record / run and replay / record, and the
# preemptions each trace logged. On PVM a recording preempts loops that
# never end but no computation that ends (docs/recording.md), so there
# the Python threads run one after the other when recorded and interleave
# when run. The SVM test bed's table, where computations in user code are
# preempted too: benches/preemption-bed.sh.
#
#   benches/preemption.sh [ROUNDS]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
provm="$repo/target/release/provm"
rounds="${1:-5}"
# shellcheck source=benches/timing.sh
source "$repo/benches/timing.sh"

cargo build --release -q --manifest-path "$repo/Cargo.toml"
busybox="$(tests_image preemption)"
debian="$("$repo/scripts/debian-image")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

preempting=(--preempt 5 --preempt-computations)
declare -A times

# measure NAME IMAGE COMMAND...: one run, one recording and its replay.
measure() {
  local name="$1" image="$2"
  shift 2
  times["$name run"]+="$(seconds "$provm" run "$image" -- "$@") "
  rm -f "$work/trace.provm"
  times["$name record"]+="$(seconds "$provm" record -o "$work/trace.provm" "${preempting[@]}" "$image" -- "$@") "
  times["$name replay"]+="$(seconds "$provm" replay "$work/trace.provm") "
  times["$name preemptions"]+="$("$provm" query "$work/trace.provm" \
    "SELECT count(*) FROM events WHERE kind LIKE '%preemption%'" | tail -1 | tr -d ' ') "
}

# The first run and recording of each boots its machine: not timed.
"$provm" run "$busybox" -- true >/dev/null 2>&1
"$provm" record -o "$work/warm.provm" "$busybox" -- true >/dev/null 2>&1
"$provm" run "$debian" -- true >/dev/null 2>&1
"$provm" record -o "$work/warm2.provm" "$debian" -- true >/dev/null 2>&1
for round in $(seq "$rounds"); do
  echo "bench: round $round of $rounds" >&2
  measure spin "$busybox" /bin/spin_flag
  measure alone "$busybox" /bin/sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i + 1)); done'
  measure python "$debian" python3 -c "$(cat "$repo/tests/data/python_threads.py")" 3000000
done

stats() { tr ' ' '\n' <<<"${times[$1]}" | grep . | summary; }
ratio() {
  local over under
  over="$(tr ' ' '\n' <<<"${times[$1]}" | grep . | median)"
  under="$(tr ' ' '\n' <<<"${times[$2]}" | grep . | median)"
  awk "BEGIN { printf \"%.2f\", $over / $under }"
}
echo "| $(uname -r), $rounds runs, median (min-max) | run (s) | record (s) | replay (s) | record / run | replay / record | preemptions |"
echo "|---|---|---|---|---|---|---|"
for workload in spin alone python; do
  echo "| $workload | $(stats "$workload run") | $(stats "$workload record") | $(stats "$workload replay") |" \
    "$(ratio "$workload record" "$workload run") | $(ratio "$workload replay" "$workload record") |" \
    "$(stats "$workload preemptions") |"
done
