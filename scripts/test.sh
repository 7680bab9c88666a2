#!/bin/sh
# Run every test, as root, against the real kernel: unit tests, the e2e
# attack suite, and short runs of the fuzzers. Installs what the tests need
# on Debian (git, procps, bubblewrap) and a Go toolchain if missing.
#   ./scripts/test.sh          (re-runs itself with sudo when not root)
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then exec sudo "$0" "$@"; fi

missing=""
for p in git:git ps:procps bwrap:bubblewrap; do
	command -v "${p%%:*}" >/dev/null 2>&1 || missing="$missing ${p#*:}"
done
if [ -n "$missing" ]; then
	echo "airlock: installing$missing" >&2
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
. scripts/go-env.sh

# A safety net for tests that exercise egress: nothing may leave this
# machine for a private or link-local address.
if [ -x ../shared/tools/netguard ]; then ../shared/tools/netguard; fi

export CGO_ENABLED=0
unformatted=$(gofmt -l cmd internal test bench)
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted" >&2; exit 1; fi
go vet ./...
go test -count=1 -timeout 40m ./...
for f in "FuzzFilterMatchesRules ./internal/linux/seccomp" "FuzzCleanName ./internal/image" "FuzzValidate ./internal/spec" "FuzzParseSize ./internal/spec" "FuzzReadClientHello ./internal/egress" "FuzzParseRule ./internal/egress"; do
	set -- $f
	go test -run '^$' -fuzz "^$1\$" -fuzztime 10s "$2"
done
