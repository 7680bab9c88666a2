#!/bin/sh
# Build runsc (gVisor), the runtime of airlock's gvisor wall, from the exact
# gvisor.dev/gvisor version third_party/runsc pins, verified against the
# module hash its go.sum records, and install it (default
# /usr/local/lib/airlock/runsc, where airlock looks for it; an argument
# names another path). The build (~2.5 min on 2 cores) is skipped when the
# installed binary is the one this script built from the same pin: a stamp
# beside it records the pin and the binary's sha256.
#   sudo ./scripts/runsc.sh [DEST]
set -eu
cd "$(dirname "$0")/.."
. scripts/go-env.sh
dest=${1:-/usr/local/lib/airlock/runsc}
# The pin: "<version> <h1 hash>" of gvisor.dev/gvisor in third_party/runsc/go.sum.
pin=$(awk '$1 == "gvisor.dev/gvisor" && $2 !~ /\/go.mod$/ { print $2 " " $3 }' third_party/runsc/go.sum)
version=${pin%% *}
case "$version" in v0.0.0-*) ;; *) echo "airlock: no gvisor.dev/gvisor pin in third_party/runsc/go.sum" >&2; exit 1 ;; esac
stamp="$dest.stamp"
if [ -x "$dest" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pin sha256:$(sha256sum "$dest" | cut -d' ' -f1)" ]; then
	echo "airlock: runsc $version is installed at $dest" >&2
	exit 0
fi
echo "airlock: building runsc $version (gVisor; a few minutes)" >&2
mkdir -p "$(dirname "$dest")"
tmp="$dest.new.$$"
trap 'rm -f "$tmp"' EXIT
# The checksum database has no entry for gVisor's go-branch pseudo-versions:
# go.sum's recorded hash is what the download is verified against.
(cd third_party/runsc && CGO_ENABLED=0 GONOSUMDB=gvisor.dev/gvisor GOFLAGS="-mod=mod -buildvcs=false" \
	go build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$version" -o "$tmp" gvisor.dev/gvisor/runsc)
chmod 0755 "$tmp"
mv -f "$tmp" "$dest"
echo "$pin sha256:$(sha256sum "$dest" | cut -d' ' -f1)" > "$stamp"
echo "airlock: installed runsc $version at $dest" >&2
