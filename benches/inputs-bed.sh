#!/usr/bin/env bash
# --input of 64 MiB and 1 GiB on the SVM test bed (scripts/svm-testbed:
# L1 under QEMU's TCG, SVM KVM inside), with the input on L1's own file
# system (its tmpfs /tmp; the bed has no disk) or on the host's, which L1
# reads over 9p; provm's cache in L1's /tmp. What the issue-35 numbers in
# docs/running.md ("The input disk, measured") come from:
#
#   benches/inputs-bed.sh floor  SIZE...   what L1 itself takes (cat,
#       sha256sum, zstd -1 and mkfs.ext4 -d of the input in /tmp)
#   benches/inputs-bed.sh record SIZE...   provm record (sha256sum of the
#       input in the guest) PROVM_INPUT_RUNS times (default 5), each
#       building the input disk anew, then a run of the unchanged input
#       and a replay from the trace alone; the input on 9p (the host's
#       folder), then in /tmp; prints a table of medians (min-max), with
#       the same recording without input (PROVM_INPUT_FROM=9p: from the
#       host's folder only)
#   benches/inputs-bed.sh peer   SIZE...   the peer: QEMU (the bed's) with
#       KVM inside L1, nested as provm is, booting provm's guest kernel
#       with the same input disk on virtio-blk and a busybox init that
#       runs sha256sum of the input (times from the guest's uptime)
#
# SIZE: 1, 64 or 1024 (MiB); each input is one file of random bytes.
# Needs L1 memory for the input, its disk and its trace in tmpfs:
# PROVM_SVM_TESTBED_MEMORY defaults to 8192 here.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
# shellcheck source=benches/timing.sh
source "$repo/benches/timing.sh"
mode="${1:?floor, record or peer}"; shift
work="$repo/target/inputs-bed"
mkdir -p "$work"
cargo build --release -q --manifest-path "$repo/Cargo.toml"
for mib in "$@"; do
  [ -s "$work/d$mib/x.bin" ] || { mkdir -p "$work/d$mib"; head -c "${mib}M" /dev/urandom >"$work/d$mib/x.bin"; }
done
# The tests' busybox image, built by the test suite (cargo test builds it).
image="$(tests_image data_io)"
if [ "$mode" = peer ]; then
  root="$work/peer-root"
  rm -rf "$root"; mkdir -p "$root"/{bin,proc,sys,dev,mnt}
  cp /bin/busybox "$root/bin/"
  cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t ext4 -o ro /dev/vda /mnt || echo "PEER no disk"
read a b < /proc/uptime; echo "PEER start $a"
sha256sum /mnt/0/*
read a b < /proc/uptime; echo "PEER end $a"
reboot -f
INIT
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet) >"$work/peer-initrd.cpio"
fi
kernel="$("$repo/target/release/provm" kernel path)"
cat >"$work/job.sh" <<JOB
set -u
W=$work P=$repo/target/release/provm IMAGE=$image KERNEL=$kernel MODE=$mode RUNS=${PROVM_INPUT_RUNS:-5} FROM=${PROVM_INPUT_FROM:-both}
Q=${PROVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provm}/svm-testbed/qemu
JOB
cat >>"$work/job.sh" <<'JOB'
TIMEFORMAT='TIME %R s'
step() { echo "== $*" >&2; time "$@"; }
mkdir -p /tmp/cache && cp -a "$PROVM_CACHE/kernels" /tmp/cache/ && export PROVM_CACHE=/tmp/cache
head -c 100000 /dev/urandom >/tmp/warm.bin
echo "== warm-up (boots the guest once)"; "$P" run --input /tmp/warm.bin:/w "$IMAGE" -- true
rm -rf /tmp/cache/inputs
# The times below less this one are the input's: a recording of the same
# command with no input.
if [ "$MODE" = record ]; then
  : >/tmp/times
  for run in $(seq "$RUNS"); do
    start=$(date +%s.%N)
    "$P" record --force "$IMAGE" -o /tmp/r.provm -- sh -c 'sha256sum /dev/null'
    echo "$(date +%s.%N) - $start" | bc >>/tmp/times
  done
  sort -n /tmp/times | awk '{ t[NR] = $1 } END { printf "TABLE | no input | %.1f s (%.1f-%.1f) |\n", t[int((NR + 1) / 2)], t[1], t[NR] }'
  rm -f /tmp/r.provm
fi
peer() {  # DISK: QEMU with KVM, provm's kernel, DISK on virtio-blk
  LD_LIBRARY_PATH=$Q/usr/lib/x86_64-linux-gnu:$Q/lib/x86_64-linux-gnu timeout 900 \
    $Q/usr/bin/qemu-system-x86_64 -L $Q/usr/share/qemu -L $Q/usr/share/seabios \
    -M microvm,pic=on,pit=on,rtc=on,acpi=off -m 256M \
    -cpu host,-apic,-x2apic,kvm=off,-kvm-poll-control -accel kvm,kernel-irqchip=off \
    -display none -nodefaults -no-reboot -serial file:/tmp/peer-serial.txt \
    -kernel "$KERNEL" -initrd "$W/peer-initrd.cpio" \
    -append "console=ttyS0 nolapic noapic lpj=5000 8250.nr_uarts=1 panic=-1 rdinit=/init" \
    -drive if=none,format=raw,readonly=on,id=d,file="$1" -device virtio-blk-device,drive=d </dev/null
  grep -a -E "PEER|/mnt/" /tmp/peer-serial.txt
}
for dir in "$@"; do
  src="$W/$(basename "$dir")"
  cp -r "$src" /tmp/in
  case $MODE in
    floor)
      step cat /tmp/in/x.bin >/dev/null
      step sha256sum /tmp/in/x.bin
      step sh -c 'zstd -q -1 -c /tmp/in/x.bin >/dev/null'
      step mkfs.ext4 -q -F -d /tmp/in /tmp/in.ext4 $(( $(stat -c %s /tmp/in/x.bin) / 1024 * 5 / 4 + 16384 ))k
      rm -f /tmp/in.ext4 ;;
    record)
      wheres=("$src" /tmp/in); [ "$FROM" = 9p ] && wheres=("$src")
      for where in "${wheres[@]}"; do
        : >/tmp/times
        for run in $(seq "$RUNS"); do
          rm -rf /tmp/cache/inputs /tmp/cache/input-identities /tmp/r.provm
          # Read from the host each time, not from what L1 kept of it.
          sync; echo 3 >/proc/sys/vm/drop_caches
          start=$(date +%s.%N)
          "$P" record --input "$where:/data" "$IMAGE" -o /tmp/r.provm -- sh -c 'sha256sum /data/*'
          echo "$(date +%s.%N) - $start" | bc >>/tmp/times
        done
        echo "== record $(basename "$src") from $where: $(sort -n /tmp/times | tr '\n' ' ')s; trace $(stat -c %s /tmp/r.provm) bytes"
        step "$P" run --input "$where:/data" "$IMAGE" -- true
        rm -rf /tmp/cache/inputs
        step "$P" replay /tmp/r.provm
        sort -n /tmp/times | awk -v what="$(basename "$src") from $where" \
          '{ t[NR] = $1 } END { printf "TABLE | %s | %.1f s (%.1f-%.1f) |\n", what, t[int((NR + 1) / 2)], t[1], t[NR] }'
        rm -rf /tmp/cache/inputs /tmp/cache/input-identities /tmp/r.provm
      done ;;
    peer)
      "$P" run --input /tmp/in:/data "$IMAGE" -- true
      for run in 1 2 3; do step peer /tmp/cache/inputs/*.ext4; done
      rm -rf /tmp/cache/inputs ;;
  esac
  rm -rf /tmp/in
done
JOB
sizes=(); for mib in "$@"; do sizes+=("d$mib"); done
PROVM_SVM_TESTBED_MEMORY="${PROVM_SVM_TESTBED_MEMORY:-8192}" PROVM_SVM_TESTBED_TIMEOUT="${PROVM_SVM_TESTBED_TIMEOUT:-7200}" \
  "$repo/scripts/svm-testbed" run -- bash "$work/job.sh" "${sizes[@]}"
