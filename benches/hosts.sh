#!/usr/bin/env bash
# Boot, restore, record and replay on both KVM kinds: this machine's PVM and
# the SVM test bed's two kernels (scripts/svm-testbed), five rounds each,
# median (min-max) seconds of wall time.
#
#   benches/hosts.sh [ROUNDS]
#
# - boot: `provm run IMAGE -- true` with an empty snapshot cache (boots the
#   guest kernel to its agent, snapshots it, runs the command);
# - restore: the same with the snapshot cached (restore, run, stop);
# - record / replay: `provm record` of a shell workload, `provm replay` of it.
# Inside the test bed, guest user space runs under TCG (about 3.5x slower
# than native) and every exit costs ~0.1 ms of nested emulation; the guest
# kernel runs at TCG speed instead of PVM's emulated ring 0.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
provm="$repo/target/release/provm"
rounds="${1:-5}"
workload='seq 1 2000 | sort -r | head -n 3; head -c 4096 /dev/urandom | md5sum; date +%s; for i in 1 2 3; do echo $i | cat | wc -c; done'

# shellcheck source=benches/timing.sh
source "$repo/benches/timing.sh"

# measure HOST IMAGE SCRATCH: one line per measurement, "HOST|what|summary".
# A subshell: its PROVM_CACHE stays its own.
measure() (
  local host="$1" image="$2" scratch="$3" i
  private_cache "$scratch/cache"
  for i in $(seq "$rounds"); do
    rm -rf "$PROVM_CACHE/snapshots"
    seconds "$provm" run "$image" -- true
  done | summary | sed "s/^/$host|boot|/"; echo
  for i in $(seq "$rounds"); do seconds "$provm" run "$image" -- true; done | summary | sed "s/^/$host|restore|/"; echo
  for i in $(seq "$rounds"); do
    seconds "$provm" record --force -o "$scratch/bench.provm" "$image" -- /bin/sh -c "$workload"
  done | summary | sed "s/^/$host|record|/"; echo
  for i in $(seq "$rounds"); do seconds "$provm" replay "$scratch/bench.provm"; done | summary | sed "s/^/$host|replay|/"; echo
)

if [ "${1:-}" = --inside ]; then
  rounds="$3"
  out="${PROVM_SVM_TESTBED_OUT:?run by scripts/svm-testbed}"
  measure "$2" "$4" /tmp/bench >"$out/results"
  exit 0
fi

[ -x "$provm" ] || { echo "hosts.sh: build provm first: cargo build --release" >&2; exit 1; }
work="$repo/target/bench-hosts"
rm -rf "$work"
"$repo/scripts/busybox-image" "$work"
results="$work/results"
measure pvm "$work/image.raw" "$work/pvm" >"$results"
for kernel in 6.12 6.1; do
  l1_out="$(mktemp -d "$work/l1-XXXXXX")"
  PROVM_SVM_TESTBED_OUT="$l1_out" "$repo/scripts/svm-testbed" run --kernel "$kernel" -- \
    bash "$repo/benches/hosts.sh" --inside "svm$kernel" "$rounds" "$work/image.raw"
  cat "$l1_out/results" >>"$results"
  rm -rf "$l1_out"
done
echo "| host | boot | restore | record | replay |"
echo "|---|---|---|---|---|"
for host in pvm svm6.12 svm6.1; do
  row="| $host"
  for what in boot restore record replay; do
    row+=" | $(grep "^$host|$what|" "$results" | cut -d'|' -f3)"
  done
  echo "$row |"
done
