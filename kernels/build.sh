#!/usr/bin/env bash
# Build the provm guest kernel.
#
#   kernels/build.sh SRC_TARBALL OUT_DIR
#
# SRC_TARBALL: a Linux 6.1 source tarball (Debian: /usr/src/linux-source-6.1.tar.xz)
# OUT_DIR:     receives vmlinux (PVH-bootable ELF, debug info stripped),
#              config (the final .config), System.map and profile.json (the
#              offsets of the kernel structures provm reads from outside the
#              guest). Written atomically: built in OUT_DIR.tmp, then renamed.
#
# The fragment (provm.config), patches (patches/*.patch) and the profile's
# source (profile/provm_profile.c) are found next to this script. No
# caching here: provm keys its cache on the tarball and every file under
# kernels/ but its documentation.
set -euo pipefail
# Name order of patches/*.patch, independent of the caller's locale.
export LC_ALL=C

if [ $# -ne 2 ]; then
	echo "usage: $0 SRC_TARBALL OUT_DIR" >&2
	exit 2
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tarball=$(realpath "$1")
out=$(realpath -m "$2")
fragment="$here/provm.config"

[ -f "$tarball" ] || { echo "provm kernel: no such tarball: $tarball" >&2; exit 1; }
[ -f "$fragment" ] || { echo "provm kernel: no fragment: $fragment" >&2; exit 1; }

out_parent=$(dirname "$out")
mkdir -p "$out_parent"
work=$(mktemp -d "$out_parent/.provm-kernel-build.XXXXXX")
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

jobs=${PROVM_KERNEL_JOBS:-$(nproc)}

# Reproducible build: no host name, user, date or build counter in the image.
export KBUILD_BUILD_TIMESTAMP="1970-01-01 00:00:00 UTC"
export KBUILD_BUILD_USER=provm KBUILD_BUILD_HOST=provm KBUILD_BUILD_VERSION=1

echo "provm kernel: extracting $(basename "$tarball")"
tar -xf "$tarball" -C "$work"
# The tarball holds one top-level directory (linux-source-6.1/, linux-6.1.y/, ...).
tops=("$work"/*/)
if [ "${#tops[@]}" -ne 1 ] || [ ! -f "${tops[0]}Makefile" ]; then
	echo "provm kernel: expected one kernel tree at the top of $tarball" >&2
	exit 1
fi
src=${tops[0]%/}

shopt -s nullglob
for p in "$here"/patches/*.patch; do
	echo "provm kernel: applying $(basename "$p")"
	# --forward: a patch that is already applied is an error, not a reversal.
	if ! patch -d "$src" -p1 --batch --forward --no-backup-if-mismatch -s < "$p"; then
		echo "provm kernel: patch $(basename "$p") does not apply" >&2
		exit 1
	fi
done
shopt -u nullglob

echo "provm kernel: configuring"
mk() { make -C "$src" -s ARCH=x86_64 "$@"; }
mk tinyconfig >/dev/null
(cd "$src" && ARCH=x86_64 ./scripts/kconfig/merge_config.sh -m .config "$fragment" >/dev/null)
mk olddefconfig >/dev/null

# Every CONFIG_X=y of the fragment must survive (unmet dependencies make
# Kconfig drop options silently).
missing=0
while IFS= read -r line; do
	if ! grep -qxF "$line" "$src/.config"; then
		sym=${line%%=*}
		got=$(grep -E "^($sym=|# $sym is not set)" "$src/.config" || true)
		echo "provm kernel: config: wanted $line, got: ${got:-<absent>}" >&2
		missing=1
	fi
done < <(grep -E '^CONFIG_[A-Za-z0-9_]+=y$' "$fragment")
if [ "$missing" -ne 0 ]; then
	echo "provm kernel: configuration lost options of provm.config (see above)" >&2
	exit 1
fi

echo "provm kernel: building (takes a few minutes)"
mk -j"$jobs" vmlinux

# The structure offsets, computed by the compiler as asm-offsets computes
# its own: a single-target build to assembler (kbuild compiles it with the
# kernel's own flags), whose '.ascii "->name $value ..."' lines hold them.
echo "provm kernel: computing the kernel profile"
cp "$here/profile/provm_profile.c" "$src/fs/provm_profile.c"
mk fs/provm_profile.s
profile_json() {
	sed -n 's/^[[:space:]]*\.ascii[[:space:]]*"->\([a-z_0-9]*\) [$#]*\([0-9-]*\) .*/\1 \2/p' "$1" |
		awk 'BEGIN { printf "{" } { printf "%s\n  \"%s\": %s", (NR > 1 ? "," : ""), $1, $2 } END { print "\n}" }'
}

echo "provm kernel: installing into $out"
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
profile_json "$src/fs/provm_profile.s" > "$tmp/profile.json"
if ! grep -q '"task_struct_pid"' "$tmp/profile.json"; then
	echo "provm kernel: the kernel profile has no offsets (see $src/fs/provm_profile.s)" >&2
	exit 1
fi
# Strip debug info only: keeps the symbol table and the .note sections,
# among them the PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY).
objcopy --strip-debug "$src/vmlinux" "$tmp/vmlinux"
cp "$src/.config" "$tmp/config"
cp "$src/System.map" "$tmp/System.map"
if ! readelf -n "$tmp/vmlinux" | grep -q 'Xen'; then
	echo "provm kernel: vmlinux has no PVH (Xen) ELF note" >&2
	exit 1
fi
if [ -e "$out" ]; then
	mv "$out" "$out.old.$$"
	mv "$tmp" "$out"
	rm -rf "$out.old.$$"
else
	mv "$tmp" "$out"
fi
echo "provm kernel: done: $out/vmlinux"
