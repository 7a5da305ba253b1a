# Shared by the shell benchmarks (hosts.sh, smp.sh): source it.

# seconds COMMAND...: the wall time of one run, failing if it fails.
seconds() {
  local start end
  start="$(date +%s.%N)"
  "$@" >/dev/null 2>&1 || { echo "bench: failed: $*" >&2; exit 1; }
  end="$(date +%s.%N)"
  echo "$end - $start" | bc
}

# summary: "median (min-max)" of the numbers on stdin.
summary() {
  sort -g | awk '{ v[NR] = $1 } END { printf "%.2f (%.2f-%.2f)", v[int((NR + 1) / 2)], v[1], v[NR] }'
}

# median: the median alone of the numbers on stdin.
median() {
  sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# private_cache DIR: PROVM_CACHE becomes DIR, holding the built guest
# kernels only, so that the first run of each machine boots it (call it
# in a subshell: the variable stays there).
private_cache() {
  mkdir -p "$1"
  cp -r "${PROVM_CACHE:-$HOME/.cache/provm}/kernels" "$1/" 2>/dev/null || true
  export PROVM_CACHE="$1"
}
