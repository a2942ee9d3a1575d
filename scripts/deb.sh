#!/bin/sh
# Builds the Debian package: scripts/deb.sh [OUTDIR] (make deb: dist/).
#
# From the binaries in BIN (default bin/, made by make build): memd and
# memagent in /usr/lib/rmem with librmem.so beside them (memagent finds the
# shim beside its own binary) and links in /usr/bin; the systemd units
# (pointing at /usr/bin), man pages and bash/zsh/fish completions generated
# from the cobra commands (bash-completion loads completions/CMD.bash too:
# the only files named memd and memagent are the binaries), the example configs and the docs in
# /usr/share/doc/rmem, and the Prometheus rules and Grafana dashboard in
# /usr/share/rmem. The package's version is the commit's (0.1.0~gitDATE.HASH);
# the binaries answer --version with VERSION (make passes git describe).
# Nothing is enabled on install: systemctl enable --now memd memagent.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dist}
bin=${BIN:-$root/bin}
case $bin in /*) ;; *) bin=$root/$bin ;; esac
for f in memd memagent librmem.so; do
	[ -f "$bin/$f" ] || { echo "scripts/deb.sh: no $bin/$f (run make build first)" >&2; exit 1; }
done
command -v dpkg-deb >/dev/null || { echo "scripts/deb.sh: dpkg-deb not found (Debian's dpkg)" >&2; exit 1; }

if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
	when=$(git -C "$root" log -1 --format=%cd --date=format:%Y%m%d%H%M%S)
	hash=$(git -C "$root" rev-parse --short=12 HEAD)
	dirty=$(git -C "$root" diff --quiet HEAD -- 2>/dev/null || echo .dirty)
	version=0.1.0~git$when.$hash$dirty
else
	version=0.1.0
fi
version=${DEB_VERSION:-$version}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
d=$stage
install -d "$d/DEBIAN" "$d/usr/bin" "$d/usr/lib/rmem" "$d/lib/systemd/system" "$d/usr/share/man/man1" \
	"$d/usr/share/bash-completion/completions" "$d/usr/share/zsh/vendor-completions" "$d/usr/share/fish/vendor_completions.d" \
	"$d/usr/share/doc/rmem/examples" "$d/usr/share/rmem/prometheus" "$d/usr/share/rmem/grafana"
install -m 0755 "$bin/memd" "$bin/memagent" "$d/usr/lib/rmem/"
install -m 0644 "$bin/librmem.so" "$d/usr/lib/rmem/"
ln -s ../lib/rmem/memd "$d/usr/bin/memd"
ln -s ../lib/rmem/memagent "$d/usr/bin/memagent"
for u in memd memagent; do
	sed -e 's|/usr/local/bin/librmem.so|/usr/lib/rmem/librmem.so|g' -e 's|/usr/local/bin/|/usr/bin/|g' \
		-e 's|^# Install: cp .*|# Installed by the rmem package: systemctl enable --now '"$u"'|' \
		"$root/configs/$u.service" >"$d/lib/systemd/system/$u.service"
	chmod 0644 "$d/lib/systemd/system/$u.service"
	"$bin/$u" man "$d/usr/share/man/man1" >/dev/null
	"$bin/$u" completion bash >"$d/usr/share/bash-completion/completions/$u.bash"
	"$bin/$u" completion zsh >"$d/usr/share/zsh/vendor-completions/_$u"
	"$bin/$u" completion fish >"$d/usr/share/fish/vendor_completions.d/$u.fish"
done
gzip -9n "$d"/usr/share/man/man1/*.1
install -m 0644 "$root"/configs/*.yaml "$d/usr/share/doc/rmem/examples/"
install -m 0644 "$root"/configs/prometheus/* "$d/usr/share/rmem/prometheus/"
install -m 0644 "$root"/configs/grafana/* "$d/usr/share/rmem/grafana/"
install -m 0644 "$root/README.md" "$root"/docs/*.md "$d/usr/share/doc/rmem/"
cat >"$d/usr/share/doc/rmem/copyright" <<COPY
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: rmem
Comment: rmem, a disaggregated-memory paging system. librmem.so embeds
 jemalloc (Debian's libjemalloc-dev, BSD-2-clause).
COPY
find "$d/usr/share/doc/rmem" "$d/usr/share/rmem" -type f -exec chmod 0644 {} +

size=$(du -sk --exclude=DEBIAN "$d" | cut -f1)
cat >"$d/DEBIAN/control" <<CTL
Package: rmem
Version: $version
Section: admin
Priority: optional
Architecture: amd64
Depends: libc6 (>= 2.34)
Recommends: fuse3
Maintainer: rmem developers <rmem@localhost>
Installed-Size: $size
Homepage: https://github.com/rmem/rmem
Description: disaggregated-memory paging over a pool of machines' RAM
 memd donates a node's spare RAM to a pool and coordinates it; memagent
 runs programs unmodified with their cold pages in other nodes' memory
 (userfaultfd, an LD_PRELOAD shim, one-sided RDMA-style reads over TCP,
 shared memory or RDMA NICs), keeping each program within a budget.
CTL
cat >"$d/DEBIAN/postinst" <<'POST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
POST
cat >"$d/DEBIAN/postrm" <<'POST'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
POST
chmod 0755 "$d/DEBIAN/postinst" "$d/DEBIAN/postrm"
mkdir -p "$out"
deb=$out/rmem_${version}_amd64.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$d" "$deb" >/dev/null
echo "$deb"
