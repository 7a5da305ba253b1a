#!/usr/bin/env bash
# Many runs, one question: 1,000 small recorded runs of a busybox pipeline
# with a parameter N (`seq 1 N | sort -rn | head -3`, N = 1 to 1,000,
# recorded with --prov, which the question by digest needs), exported to
# Parquet, then three questions over all of them in DuckDB beside the same
# three through `provm query` over the traces: events by kind, the runs
# that ran a given file (busybox, by its SHA-256), and hypervisor blame by
# the parameter. Medians of ROUNDS (5) with min and max, seconds: DuckDB's
# time for the query (`scripts/duckdb --time`), the wall time of
# `scripts/duckdb` (with Python's start and DuckDB's import), and that of
# `provm query`.
#
#   benches/sweep.sh [ROUNDS]     # or --record: record the runs, and stop
#
# The runs are recorded once (about an hour on a 2-core host) into
# ${PROVM_CACHE:-~/.cache/provm}/bench/sweep and reused: a run whose trace
# is there is not recorded again, so an interrupted recording resumes
# where it stopped. Each recording takes /tmp/provm-guests.lock, so that
# others can run guests between two. PROVM_SWEEP_RUNS (default 1000) says
# how many runs (the first ones); PROVM_SWEEP_QUERY_RUNS (default all) over
# how many of them `provm query` is timed, its loading of every trace
# being the slow part. The dataset stays in the same folder (parquet/),
# for more questions.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/timing.sh
rounds=5
record_only=
case "${1:-}" in
  --record) record_only=1 ;;
  "") ;;
  *) rounds="$1" ;;
esac
runs="${PROVM_SWEEP_RUNS:-1000}"
query_runs="${PROVM_SWEEP_QUERY_RUNS:-$runs}"
cargo build --release -q
provm="$(realpath "${CARGO_TARGET_DIR:-target}/release/provm")"
cache="${PROVM_CACHE:-$HOME/.cache/provm}/bench/sweep"

# The runs: the busybox image, built once, and a trace of each N (a trace
# is renamed into place when whole, so one that is there is done).
mkdir -p "$cache"
[ -f "$cache/image.raw" ] || scripts/busybox-image "$cache" >/dev/null
for i in $(seq "$runs"); do
  [ -f "$cache/run-$i.provm" ] && continue
  echo "bench: recording run $i of $runs into $cache" >&2
  nice -n 10 flock /tmp/provm-guests.lock "$provm" record --force \
    --prov "$cache/run-$i.prov" -o "$cache/run-$i.provm" "$cache/image.raw" \
    -- sh -c "seq 1 $i | sort -rn | head -3" >/dev/null 2>"$cache/record.log" || {
    echo "bench: recording run $i failed:" >&2
    cat "$cache/record.log" >&2
    exit 1
  }
  rm "$cache/run-$i.prov"
done
[ -z "$record_only" ] || exit 0

traces=()
for i in $(seq "$runs"); do traces+=("$cache/run-$i.provm"); done
# The export, once: every run into one dataset, left beside the traces.
dataset="$cache/parquet"
rm -rf "$dataset"
start="$(date +%s.%N)"
"$provm" export parquet "${traces[@]}" -o "$dataset" 2>"$cache/export.log" || {
  cat "$cache/export.log" >&2
  exit 1
}
end="$(date +%s.%N)"
export_s="$(echo "$end - $start" | bc)"
traces_bytes="$(cat "${traces[@]}" | wc -c)"
dataset_bytes="$(du -sb "$dataset" | cut -f1)"

# The questions, each in the SQL both SQLite and DuckDB take, naming the
# tables as `provm query` does; over the dataset, each table becomes its
# Parquet files (and keeps its name). The parameter N is cut out of the
# recorded command line, manifest.argv; blame is by runs of 100 Ns.
busybox="$(sha256sum "$cache/root/bin/busybox" | cut -d' ' -f1)"
parameter="CAST(substr(argv, instr(argv, 'seq 1 ') + 6, instr(argv, ' | sort') - instr(argv, 'seq 1 ') - 6) AS INTEGER)"
names=("events by kind" "runs that ran busybox (by digest)" "blame by N")
questions=(
  "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY n DESC"
  "SELECT count(DISTINCT run) AS runs FROM depends_on WHERE sha256 = '$busybox'"
  "SELECT $parameter - ($parameter - 1) % 100 AS n_from, count(DISTINCT run) AS runs,
     round(sum(vmm_ns) / 1e6 / count(DISTINCT run), 2) AS vmm_ms_per_run,
     round(100.0 * sum(vmm_ns) / sum(wall_ns), 3) AS vmm_percent
   FROM manifest JOIN blame USING (run) GROUP BY n_from ORDER BY n_from"
)
over_dataset() {
  sed -E "s#(FROM|JOIN) (events|depends_on|manifest|blame)\\b#\\1 read_parquet('$dataset/\\2/*/*.parquet', hive_partitioning = true) \\2#g" <<<"$1"
}

# rounds COMMAND...: the summary of $rounds wall times of COMMAND.
rounds() {
  local i
  for i in $(seq "$rounds"); do seconds "$@"; done | summary
}
# in_duckdb SQL: the summary of $rounds times of SQL in DuckDB, without
# Python's start.
in_duckdb() {
  local i
  for i in $(seq "$rounds"); do scripts/duckdb --time "$1"; done | summary
}

echo "| $runs runs | seconds |"
echo "|---|---|"
printf "| export parquet, per run | %.3f |\n" "$(echo "$export_s / $runs" | bc -l)"
printf "| export parquet, all (once) | %.1f |\n" "$export_s"
printf "| dataset size / traces' size | %d / %d MB (%.1f %%) |\n" \
  $((dataset_bytes / 1000000)) $((traces_bytes / 1000000)) "$(echo "100 * $dataset_bytes / $traces_bytes" | bc -l)"
echo
echo "| question | DuckDB: the query | DuckDB: scripts/duckdb | provm query ($query_runs traces) |"
echo "|---|---|---|---|"
for q in "${!questions[@]}"; do
  sql="$(over_dataset "${questions[$q]}")"
  echo "| ${names[$q]} | $(in_duckdb "$sql") | $(rounds scripts/duckdb "$sql") | $(rounds "$provm" query "${traces[@]:0:query_runs}" "${questions[$q]}") |"
done
echo
for q in "${!questions[@]}"; do
  echo "${names[$q]}:"
  scripts/duckdb "$(over_dataset "${questions[$q]}")"
done
