#!/bin/sh
# Run every test, as root, against the real kernel: unit tests, the e2e
# attack suite, and short runs of the fuzzers. Installs what the tests need
# on Debian (git, procps, bubblewrap) and a Go toolchain if missing.
#   ./scripts/test.sh          (re-runs itself with sudo when not root)
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then exec sudo "$0" "$@"; fi

# Sandboxes of the host image see the host's /usr: the tests run Debian's
# python3, ps, git, dpkg-deb and friends there.
missing=""
for p in /usr/bin/git:git /usr/bin/ps:procps /usr/bin/bwrap:bubblewrap /usr/bin/python3:python3 /usr/bin/dpkg-deb:dpkg /usr/sbin/useradd:passwd /usr/bin/su:util-linux; do
	[ -x "${p%%:*}" ] || missing="$missing ${p#*:}"
done
if [ -n "$missing" ]; then
	echo "airlock: installing$missing" >&2
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
. scripts/go-env.sh

# A safety net for tests that exercise egress: nothing may leave this
# machine for a private or link-local address.
if [ -x ../shared/tools/netguard ]; then ../shared/tools/netguard; fi

# runsc for the gvisor wall's tests (built once per pin): under CI=true
# they fail rather than skip without it.
./scripts/runsc.sh

# kube-apiserver and etcd for the k8s module's real-cluster tests (k8s/e2e;
# built once per pin): under CI=true they fail rather than skip without them.
./scripts/kube.sh
export AIRLOCK_KUBE_BIN=/usr/local/lib/airlock/kube

# The E2B SDK at its pinned version, for the E2B front's test (TestE2BSDK).
# Without it TestE2BSDK skips (under CI=true it fails).
if command -v npm >/dev/null; then
	(cd test/e2b && npm ci --no-audit --no-fund --silent) || echo "airlock: npm ci in test/e2b failed: TestE2BSDK will skip" >&2
fi

export CGO_ENABLED=0
unformatted=$(gofmt -l cmd internal test bench api client)
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted" >&2; exit 1; fi
go vet ./...
go test -count=1 -timeout 40m ./...
# The cluster side: a module of its own (k8s/), its tests against a real
# kube-apiserver, etcd and three airlock daemons.
unformatted=$(cd k8s && gofmt -l .)
if [ -n "$unformatted" ]; then echo "gofmt needed in k8s/: $unformatted" >&2; exit 1; fi
(cd k8s && go vet ./... && go test -count=1 -timeout 30m ./...)
# A count, not a duration: Go 1.26's fuzz coordinator can report its own
# -fuzztime deadline as a failure (golang/go#75804, fixed in Go 1.27).
for f in "FuzzFilterMatchesRules ./internal/linux/seccomp 200000" "FuzzCleanName ./internal/image/unpack 200000" "FuzzValidate ./internal/spec 200000" \
	"FuzzParseSize ./internal/spec 200000" "FuzzReadClientHello ./internal/egress/sni 200000" "FuzzParseRule ./internal/egress/policy 200000" \
	"FuzzSpecOf ./internal/sandbox/core 200000" "FuzzVerifyCatchesEveryEdit ./internal/audit 20000" \
	"FuzzRequestRule ./internal/spec 200000" "FuzzScan ./internal/scan 20000" \
	"FuzzQuoteIsSafeAndReversible ./internal/untrusted 200000" "FuzzLinkInsideNeverEscapes ./internal/untrusted 20000" \
	"FuzzScanCallIsBounded ./internal/sandbox/core 500" \
	"FuzzOpenStaysBeneathRoot ./internal/linux/hostpath 50000" "FuzzRootOf ./internal/spec 200000" \
	"FuzzExtractTarStaysInside ./internal/cli/remote 20000" "FuzzWalkReadsEachFileOnce ./internal/workspace 5000" \
	"FuzzRecordKeepsNoPartOfAKey ./internal/egress/eventlog 200000" "FuzzCheckoutName ./internal/workspace/checkout 200000" \
	"FuzzParseKey ./internal/linux/cgroup 200000"; do
	set -- $f
	go test -run '^$' -fuzz "^$1\$" -fuzztime "$3x" "$2"
done
