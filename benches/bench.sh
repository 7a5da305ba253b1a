#!/usr/bin/env bash
# provm's benchmark table: kernel build (cold, in a scratch cache, and
# cached), boot and command latency against QEMU TCG (benches/boot.rs), the
# cost of provenance capture (benches/provenance.rs), pinned runs against
# plain ones (benches/pinned.rs), then record and replay cost against QEMU
# TCG's record/replay (benches/replay.rs), and query and export times on a
# million-event trace (benches/query.rs), replay with each analysis
# against plain replay (benches/analysis.rs), what-if forks against plain
# replay (benches/fork.rs), what time travel costs under gdb
# (benches/gdb.rs), and hypervisor blame: the cost of exit timing, the
# injected-delay validation sweep and a what-if replay against its
# measurement (benches/blame.rs), what state checks cost
# (benches/state_check.rs), a 100 MB download through the guest's
# network under run and record (benches/net.rs), and --input's rate under
# record and replay (benches/inputs.rs; 1 MiB here, by the input disk;
# PROVM_INPUT_MIB says more), containers started by Podman with
# provm-runtime against runc (benches/runtime.sh), and 1,000 recorded runs
# exported to Parquet and asked three questions in DuckDB and through
# `provm query` (benches/sweep.sh; recorded once and cached, the first
# time for about an hour).
# Usage: benches/bench.sh [--skip-cold]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
provm="${CARGO_TARGET_DIR:-target}/release/provm"
seconds() { local start=$SECONDS; "$@" >/dev/null 2>&1; echo $((SECONDS - start)); }
echo "| kernel build | seconds |"
echo "|---|---|"
if [ "${1:-}" != "--skip-cold" ]; then
  scratch="$(mktemp -d)"
  echo "| cold (empty cache) | $(PROVM_CACHE="$scratch" seconds $provm kernel build) |"
  rm -rf "$scratch"
fi
$provm kernel build >/dev/null 2>&1
start=$(date +%s.%N); $provm kernel build >/dev/null 2>&1; end=$(date +%s.%N)
printf "| cached | %.3f |\n" "$(echo "$end - $start" | bc)"
echo
cargo bench -q --bench boot 2>/dev/null
echo
cargo bench -q --bench provenance 2>/dev/null
echo
cargo bench -q --bench pinned 2>/dev/null
echo
cargo bench -q --bench replay 2>/dev/null
echo
cargo bench -q --bench query 2>/dev/null
echo
cargo bench -q --bench analysis 2>/dev/null
echo
cargo bench -q --bench fork 2>/dev/null
echo
cargo bench -q --bench gdb 2>/dev/null
echo
cargo bench -q --bench blame 2>/dev/null
echo
cargo bench -q --bench state_check 2>/dev/null
echo
cargo bench -q --bench net 2>/dev/null
echo
PROVM_INPUT_MIB="${PROVM_INPUT_MIB:-1}" cargo bench -q --bench inputs 2>/dev/null
echo
benches/runtime.sh
echo
benches/sweep.sh
