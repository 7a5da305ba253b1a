#!/usr/bin/env bash
# provm-runtime against runc, both started by Podman: `podman run --rm
# IMAGE true` and a Python one-liner, with runc, with provm-runtime
# recording turned off (the annotation) and recording, the rounds
# alternated so that a slow stretch of the host hits all alike; then a root
# the runtime has not seen before (its disk made and its guest booted
# first). Medians of ROUNDS (5) with min and max, seconds, and provm's time
# split into its phases, as the runtime's --debug log gives them (the
# root's disk, the booted guest, the restore, the command, the power-off,
# the trace, the write-back of the root).
#
# The container image is the root of scripts/debian-image's Debian with
# python3, so that both runtimes run the same files.
# Usage: benches/runtime.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/timing.sh
rounds="${1:-5}"
cargo build --release -q
release="$(realpath "${CARGO_TARGET_DIR:-target}/release")"
provm="$release/provm"
for tool in podman runc; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing: run scripts/install-deps" >&2; exit 1; }
done
debian="$(scripts/debian-image)"
work="$(mktemp -d)"
# Podman's storage stays mounted until it is reset.
trap 'podman_ system reset -f >/dev/null 2>&1; rm -rf "$work"' EXIT

# A private Podman whose conmon passes the runtime what it needs.
printf '[engine]\nconmon_env_vars = ["PATH=%s", "HOME=%s", "PROVM_RUNTIME_TRACES=%s"]\n' \
  "$PATH" "$HOME" "$work/traces" >"$work/containers.conf"
podman_() {
  CONTAINERS_CONF="$work/containers.conf" podman --cgroup-manager=cgroupfs \
    --root "$work/root" --runroot "$work/runroot" --tmpdir "$work/tmp" "$@"
}
# This host's hard limit on open files is below Podman's default.
run_options=(--rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
python_script='import json; print(json.dumps(sum(range(10**6))))'

# The Debian image's root as a container image (the same files both
# runtimes run), read out of its ext4 by debugfs.
echo "bench: making the container image of the Debian root" >&2
qemu-img convert -O raw "$debian" "$work/debian.raw"
mkdir "$work/debian-root"
debugfs -R "rdump / $work/debian-root" "$work/debian.raw" >/dev/null 2>&1
rm "$work/debian.raw"
tar -C "$work/debian-root" -cf - . | podman_ import -q - localhost/debian >/dev/null
rm -rf "$work/debian-root"

# timed LOG RUNTIME [PODMAN RUN OPTIONS] IMAGE: one `podman run`,
# its wall time in seconds; the runtime's debug lines go to LOG.
timed() {
  local log="$1" runtime="$2" start end
  shift 2
  : >"$log"
  start="$(date +%s.%N)"
  podman_ --runtime-flag debug --runtime-flag "log=$log" \
    run --runtime "$runtime" "${run_options[@]}" "$@" >"$work/output" 2>&1 || {
    echo "bench: failed: podman run --runtime $runtime $*" >&2
    cat "$work/output" "$log" >&2
    exit 1
  }
  end="$(date +%s.%N)"
  echo "$end - $start" | bc
}

# phase LOG NAME: the milliseconds the runtime's log gives for phase NAME.
phase() {
  sed -n "s/.*phase=\\\\\"$2\\\\\" ms=\\([0-9]*\\).*/\\1/p" "$1" | tail -1
}

phases=("root disk" "booted guest" "restore" "trace start" "command" "power off" "trace end" "write back")
declare -A times
# sample KEY VALUE: keeps a measurement.
sample() { times["$1"]+="$2 "; }
# phases_of LOG KEY: each phase LOG gives, kept under "KEY PHASE".
phases_of() {
  local name ms
  for name in "${phases[@]}"; do
    ms="$(phase "$1" "$name")"
    [ -n "$ms" ] && sample "$2 $name" "$(echo "scale=3; $ms / 1000" | bc)"
  done
  return 0
}

workloads=("true" "python")
off=(--annotation run.provm.record=false)
# timed_workload LOG RUNTIME WORKLOAD [PODMAN RUN OPTIONS]: `timed` of the
# workload's command in the Debian image.
timed_workload() {
  local log="$1" runtime="$2" workload="$3"
  shift 3
  case "$workload" in
    true) timed "$log" "$runtime" "$@" localhost/debian true ;;
    python) timed "$log" "$runtime" "$@" localhost/debian python3 -c "$python_script" ;;
  esac
}
# A first run of each makes the root's disk and boots its guest, and one
# not recorded boots the run's own (on PVM, the run's guest kernel keeps
# user mode's vector state through the VMM, a recording's does not): not
# timed.
for workload in "${workloads[@]}"; do
  timed_workload "$work/log" "$release/provm-runtime" "$workload" >/dev/null
  timed_workload "$work/log" "$release/provm-runtime" "$workload" "${off[@]}" >/dev/null
done
for round in $(seq "$rounds"); do
  echo "bench: round $round of $rounds" >&2
  for workload in "${workloads[@]}"; do
    sample "$workload runc" "$(timed_workload "$work/log" runc "$workload")"
    sample "$workload off" "$(timed_workload "$work/log" "$release/provm-runtime" "$workload" "${off[@]}")"
    phases_of "$work/log" "$workload off"
    sample "$workload on" "$(timed_workload "$work/log" "$release/provm-runtime" "$workload")"
    phases_of "$work/log" "$workload on"
  done
  # A root not seen before: the Debian root with a file of this round's.
  mkdir -p "$work/new-$round"
  echo "$round" >"$work/new-$round/round"
  printf 'FROM localhost/debian\nCOPY round /round\n' >"$work/new-$round/Containerfile"
  podman_ build -q -t "localhost/new-$round" "$work/new-$round" >/dev/null
  sample "new root on" "$(timed "$work/log" "$release/provm-runtime" "localhost/new-$round" true)"
  phases_of "$work/log" "new root on"
done

row() {
  local label="$1" key="$2" runc_key="${3:-}"
  local values="${times[$key]:-}"
  [ -n "$values" ] || return 0
  local median ratio=""
  median="$(tr ' ' '\n' <<<"$values" | grep . | median)"
  if [ -n "$runc_key" ]; then
    ratio="$(echo "scale=2; $median / $(tr ' ' '\n' <<<"${times[$runc_key]}" | grep . | median)" | bc)"
  fi
  echo "| $label | $(tr ' ' '\n' <<<"$values" | grep . | summary) | $ratio |"
}
echo "| podman run --rm (seconds, median of $rounds (min-max)) | time | / runc |"
echo "|---|---|---|"
for workload in "${workloads[@]}"; do
  row "$workload: runc" "$workload runc"
  row "$workload: provm-runtime, recording off" "$workload off" "$workload runc"
  row "$workload: provm-runtime, recording" "$workload on" "$workload runc"
  for name in "${phases[@]}"; do
    row "&nbsp;&nbsp;recording: $name" "$workload on $name"
  done
done
row "a root not seen before, recording" "new root on"
for name in "${phases[@]}"; do
  row "&nbsp;&nbsp;$name" "new root on $name"
done
