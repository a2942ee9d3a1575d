#!/usr/bin/env bash
# Runs the verbs rdma provider's tests over real verbs (Soft-RoCE, rdma_rxe)
# in a QEMU guest, and exits with their status.
#
# The host kernel has no RDMA stack; Debian's kernel package has one. This
# script downloads that kernel (apt-get download, cached in $RMEM_VM_CACHE),
# builds a busybox initramfs holding the needed modules, the host's rdma
# userland (libibverbs, the rxe provider, iproute2's rdma tool) and the test
# binaries (go test -c -tags verbs), boots it under TCG, and parses the exit
# marker the guest prints on its serial console. Nothing goes into the repo.
#
# Usage: tests/rdma-vm/run.sh [go test flags for the guest, e.g. -test.run Conformance]
# The guest runs the tests three times: plain, with GOMAXPROCS=1, and built
# with -race (RMEM_VM_RACE=0 skips that one), then the end-to-end check
# e2e.sh: memd serving over verbs, memagent paging a program through it
# (RMEM_VM_E2E=0 skips it). RMEM_VM_VERBOSE=1 prints the guest's log even
# on success.
# Exit status: the guest tests' status; 77 when this machine cannot run the
# guest at all (no QEMU and no way to install it), 1 on a harness failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

CACHE=${RMEM_VM_CACHE:-/var/cache/rmem-vm}
TIMEOUT=${RMEM_VM_TIMEOUT:-300}
MARK=RMEM-VM-EXIT

log() { echo "rdma-vm: $*" >&2; }
skip() { echo "rdma-vm: SKIP: $*" >&2; exit 77; }

export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin
export DEBIAN_FRONTEND=noninteractive

# Host tools: qemu, busybox, kmod, cpio, and the verbs headers and
# libraries the provider links against.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
{ [ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -x insmod >/dev/null; } || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
command -v rdma >/dev/null || need+=(iproute2)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -e /etc/libibverbs.d/rxe.driver ] || need+=(ibverbs-providers)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
	if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
		skip "missing ${need[*]} and cannot install them (no apt-get or not root)"
	fi
	log "installing ${need[*]}"
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 ||
		skip "could not install ${need[*]}"
fi
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not available"

# The kernel: the package linux-image-amd64 depends on, unpacked once.
mkdir -p "$CACHE/debs"
if [ -z "${RMEM_VM_KPKG:-}" ]; then
	RMEM_VM_KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$RMEM_VM_KPKG" ] || { log "cannot tell which kernel package linux-image-amd64 names"; exit 1; }
KVER=${RMEM_VM_KPKG#linux-image-}
KROOT=$CACHE/kernel-$KVER
if [ ! -e "$KROOT/.done" ]; then
	log "fetching $RMEM_VM_KPKG"
	(cd "$CACHE/debs" && apt-get download "$RMEM_VM_KPKG" >&2 2>/dev/null) ||
		{ log "apt-get download $RMEM_VM_KPKG failed"; exit 1; }
	rm -rf "$KROOT"
	dpkg -x "$CACHE"/debs/"$RMEM_VM_KPKG"_*.deb "$KROOT"
	depmod -b "$KROOT" "$KVER"
	touch "$KROOT/.done"
fi

WORK=$(mktemp -d /tmp/rmem-vm.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
R=$WORK/root
mkdir -p "$R"/{bin,sbin,dev,proc,sys,tmp,etc,lib/mod,tests,run}

# Test binaries, built on the host with cgo against libibverbs.
log "building test binaries"
CGO_ENABLED=1 go test -c -tags verbs -o "$R/tests/verbs.test" ./rdma/verbs
bins=("$R/tests/verbs.test" "$(command -v rdma)")
if [ "${RMEM_VM_RACE:-1}" = 1 ]; then
	CGO_ENABLED=1 go test -c -race -tags verbs -o "$R/tests/verbs-race.test" ./rdma/verbs
	bins+=("$R/tests/verbs-race.test")
fi
# The end-to-end check (tests/rdma-vm/e2e.sh): memd and memagent built with
# the verbs provider, the shim beside memagent (where run finds it), and
# the demo program, as scripts/demo.sh builds them.
if [ "${RMEM_VM_E2E:-1}" = 1 ]; then
	log "building memd, memagent (-tags verbs), librmem.so, pagedemo"
	mkdir -p "$R/opt/rmem"
	CGO_ENABLED=1 go build -tags verbs -o "$R/opt/rmem/" ./cmd/memd ./cmd/memagent
	preload/build.sh "$R/opt/rmem/librmem.so"
	gcc -O2 -Wall -o "$R/opt/rmem/pagedemo" examples/pagedemo.c
	cp "$ROOT/tests/rdma-vm/e2e.sh" "$R/tests/e2e.sh"
	chmod +x "$R/tests/e2e.sh"
	bins+=("$R"/opt/rmem/*)
fi

# Modules, in load order, decompressed if needed.
mods=()
for m in crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe virtio_pci virtio_net; do
	while read -r verb path _; do
		[ "$verb" = insmod ] || continue
		case " ${mods[*]-} " in *" $path "*) continue ;; esac
		mods+=("$path")
	done < <(modprobe -d "$KROOT" -S "$KVER" --show-depends "$m")
done
: >"$R/modules"
for p in "${mods[@]}"; do
	b=$(basename "$p")
	case "$b" in
	*.ko.xz) xz -dc "$p" >"$R/lib/mod/${b%.xz}"; b=${b%.xz} ;;
	*.ko.zst) zstd -qdc "$p" >"$R/lib/mod/${b%.zst}"; b=${b%.zst} ;;
	*) cp "$p" "$R/lib/mod/$b" ;;
	esac
	echo "$b" >>"$R/modules"
done

# Userland: busybox, then the shared-library closure of the binaries and
# of the rxe provider (dlopen'ed by libibverbs, so ldd does not see it).
cp /bin/busybox "$R/bin/busybox"
cp "$(command -v rdma)" "$R/bin/rdma"
mkdir -p "$R/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
prov=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)
bins+=("$prov")
copylib() {
	local src=$1 dst=$R$1
	[ -e "$dst" ] && return
	mkdir -p "$(dirname "$dst")"
	cp -L "$src" "$dst"
}
copylib "$prov"
for b in "${bins[@]}"; do
	while read -r lib; do copylib "$lib"; done < <(ldd "$b" | grep -o '/[^ ]*' | sort -u)
done
# The dynamic loader must be at the path the binaries name.
[ -e "$R/lib64/ld-linux-x86-64.so.2" ] || copylib /lib64/ld-linux-x86-64.so.2

# Test arguments for the guest (one per line, so spaces survive).
: >"$R/tests/args"
for a in "$@"; do printf '%s\n' "$a" >>"$R/tests/args"; done

cp "$ROOT/tests/rdma-vm/init" "$R/init"
chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet | gzip -1 >"$WORK/initrd.gz")
log "initramfs $(du -h "$WORK/initrd.gz" | cut -f1), kernel $KVER; booting"

# TCG: /dev/kvm on these machines is not usable for guests (DESIGN.md).
start=$(date +%s)
set +e
timeout "$TIMEOUT" qemu-system-x86_64 \
	-accel tcg,thread=multi -cpu max -smp 2 -m 1536 \
	-kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$WORK/initrd.gz" \
	-append "console=ttyS0 panic=-1 quiet" \
	-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile= \
	-nographic -monitor none -no-reboot >"$WORK/serial.log" 2>&1
qrc=$?
set -e
log "qemu exited with $qrc after $(($(date +%s) - start))s"

rc=$(tr -d '\r' <"$WORK/serial.log" | sed -n "s/.*$MARK=\([0-9][0-9]*\).*/\1/p" | tail -1)
if [ -z "$rc" ] || [ "$rc" != 0 ] || [ -n "${RMEM_VM_VERBOSE:-}" ]; then
	echo "----- guest serial log -----" >&2
	tr -d '\r' <"$WORK/serial.log" >&2
	echo "----- end of guest serial log -----" >&2
fi
# The end-to-end check's one-line summary, for the CI log.
tr -d '\r' <"$WORK/serial.log" | grep '^rdma-vm e2e: PASS' >&2 || true
if [ -z "$rc" ]; then
	log "FAIL: no exit marker from the guest (qemu status $qrc; 124 = timeout after ${TIMEOUT}s)"
	exit 1
fi
if [ "$rc" != 0 ]; then
	log "FAIL: guest tests exited with $rc"
else
	log "PASS"
fi
exit "$rc"
