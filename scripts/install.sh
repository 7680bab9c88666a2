#!/bin/sh
# Build airlock and airlock-init (what runs inside every sandbox; airlock
# runs the one beside it, of its own build) and install them as
# /usr/local/bin/airlock and /usr/local/bin/airlock-init, then check this
# host with `airlock doctor`. Run as root on Debian:
#   sudo ./scripts/install.sh
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then exec sudo "$0" "$@"; fi
. scripts/go-env.sh
version=$(git describe --always --dirty 2>/dev/null || echo dev)
echo "airlock: building $version with $(go version | cut -d' ' -f3)" >&2
CGO_ENABLED=0 go build -trimpath -buildvcs=false \
	-ldflags "-s -w -X github.com/airlock-sandbox/airlock/internal/version.Version=$version" \
	-o /usr/local/bin/ ./cmd/airlock ./cmd/airlock-init
echo "airlock: installed /usr/local/bin/airlock and /usr/local/bin/airlock-init" >&2
# runsc, for --isolation gvisor: built from the pinned gVisor module (once
# per pin), installed as /usr/local/lib/airlock/runsc.
./scripts/runsc.sh
# The daemon's unit (airlock serve), for hosts with systemd; not enabled.
if [ -d /etc/systemd/system ]; then
	install -m 0644 dist/airlock.service /etc/systemd/system/airlock.service
	echo "airlock: installed the airlock.service unit (systemctl enable --now airlock to run the daemon)" >&2
fi
install -d /usr/local/share/doc/airlock && install -m 0644 docs/*.md /usr/local/share/doc/airlock/
# The manual pages, generated from the commands (man airlock, man airlock-exec).
/usr/local/bin/airlock man /usr/local/share/man/man1 2>/dev/null
echo "airlock: installed the manual pages in /usr/local/share/man/man1" >&2
/usr/local/bin/airlock doctor >&2
