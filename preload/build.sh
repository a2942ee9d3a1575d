#!/bin/sh
# Builds the LD_PRELOAD shim: preload/build.sh OUT.so
#
# The one entry point for every build of librmem.so (make shim, make
# build, preload/shimtest.Build). The shim embeds jemalloc from Debian's
# libjemalloc_pic.a (package libjemalloc-dev): a copy of the archive,
# without its C++ operators (new and delete keep going through libstdc++
# to malloc, the shim's) and its constructor, gets its symbols renamed by
# objcopy
# (src/jemalloc.syms; src/heap.c says why), and is linked with its
# symbols hidden, so that librmem.so exports the shim's own functions
# only. As root, a missing libjemalloc-dev is installed with apt-get;
# otherwise its archive is fetched with apt-get download into a cache.
# CC picks the compiler (default gcc).
set -eu
out=${1:?usage: preload/build.sh OUT.so}
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-gcc}

pic=$($cc -print-file-name=libjemalloc_pic.a)
if [ ! -f "$pic" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "preload/build.sh: installing libjemalloc-dev (its libjemalloc_pic.a is built into librmem.so)" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq libjemalloc-dev >&2 ||
		{ apt-get update -qq >&2 && apt-get install -y -qq libjemalloc-dev >&2; } || true
	pic=$($cc -print-file-name=libjemalloc_pic.a)
fi
if [ ! -f "$pic" ] && command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
	# Not root (a test run as an unprivileged user), or the install
	# failed: the package's archive is fetched and unpacked into a cache
	# of this user's, which needs no privilege.
	cache=${XDG_CACHE_HOME:-${TMPDIR:-/tmp}}/rmem-libjemalloc-dev-$(id -u)
	pic=$(find "$cache" -name libjemalloc_pic.a 2>/dev/null | head -1)
	if [ -z "$pic" ]; then
		echo "preload/build.sh: fetching libjemalloc-dev into $cache (its libjemalloc_pic.a is built into librmem.so)" >&2
		mkdir -p "$cache" && chmod 700 "$cache"
		(cd "$cache" && apt-get download -qq libjemalloc-dev >&2 && dpkg-deb -x libjemalloc-dev_*.deb root) || true
		pic=$(find "$cache" -name libjemalloc_pic.a 2>/dev/null | head -1)
	fi
fi
if [ ! -f "$pic" ]; then
	echo "preload/build.sh: libjemalloc_pic.a not found: install the package libjemalloc-dev (Debian, Ubuntu) and build again" >&2
	exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$pic" "$tmp/je.a"
if ar t "$tmp/je.a" | grep -qx jemalloc_cpp.pic.o; then
	ar d "$tmp/je.a" jemalloc_cpp.pic.o
fi
# jemalloc's constructor goes (its .init_array entry): it would initialize
# jemalloc at load time in every mode, and in foreign mode, with no heap to
# map, it fails out loud; jemalloc initializes at its first call instead.
objcopy --remove-section=.init_array --redefine-syms="$here/src/jemalloc.syms" "$tmp/je.a"
$cc -O2 -fPIC -shared -pthread -fvisibility=hidden -Wall -Wextra -Werror \
	-o "$tmp/librmem.so" "$here"/src/*.c "$tmp/je.a" \
	-Wl,--exclude-libs,ALL -Wl,-z,now -Wl,-z,relro -ldl -lm
mv -f "$tmp/librmem.so" "$out"
