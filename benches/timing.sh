# Shared by the shell benchmarks (hosts.sh, smp.sh and others): source it.

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

# tests_image MODULE: the tests' busybox image under $repo (the newest the
# test suite built), or an error that names the suite's MODULE, which
# builds it.
tests_image() {
  local image
  image="$(ls -t "$repo"/target/tmp/test-images/*/tiny.qcow2 2>/dev/null | head -n 1)"
  [ -n "$image" ] || { echo "no test image: run cargo test --release --test suite $1 first" >&2; return 1; }
  echo "$image"
}
