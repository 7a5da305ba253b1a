#!/usr/bin/env bash
# Build the SMP variant of the provm guest kernel (`--cpus N`, N > 1).
#
#   kernels/smp/build.sh SRC_TARBALL OUT_DIR
#
# The single-CPU kernel's inputs (../build.sh, ../provm.config,
# ../patches) plus this directory's: smp.config replaces the fragment's
# `# CONFIG_SMP is not set`, and patches/*.patch are applied after the
# common ones. The single-CPU kernel does not depend on anything here, so
# its cache key (and every trace and snapshot made with it) stays as it is.
set -euo pipefail
export LC_ALL=C

if [ $# -ne 2 ]; then
	echo "usage: $0 SRC_TARBALL OUT_DIR" >&2
	exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
common=$(dirname "$here")
inputs=$(mktemp -d)
trap 'rm -rf "$inputs"' EXIT

cp -r "$common/build.sh" "$common/patches" "$common/profile" "$inputs/"
for p in "$here"/patches/*.patch; do
	# After the common patches in build.sh's name order.
	cp "$p" "$inputs/patches/smp-$(basename "$p")"
done
{
	grep -vx '# CONFIG_SMP is not set' "$common/provm.config"
	cat "$here/smp.config"
} > "$inputs/provm.config"
exec bash "$inputs/build.sh" "$1" "$2"
