# Sourced by the other scripts: puts a Go toolchain of at least the version
# go.mod names on PATH. It uses the one on PATH or in /usr/local/go; failing
# that it installs Debian's golang-go and lets it fetch the required
# toolchain from the Go module proxy (GOTOOLCHAIN).
want=$(awk '/^go /{print $2; exit}' go.mod)
for d in "" /usr/local/go/bin /usr/lib/go/bin; do
	if [ -n "$d" ] && [ -x "$d/go" ]; then PATH="$d:$PATH"; fi
	if command -v go >/dev/null 2>&1; then break; fi
done
if ! command -v go >/dev/null 2>&1; then
	echo "airlock: installing Debian's golang-go to bootstrap Go $want" >&2
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
fi
# An older go fetches go$want itself (Go 1.21 and later understand this).
export GOTOOLCHAIN="go$want+auto"
export PATH
if ! go version >/dev/null 2>&1; then
	echo "airlock: no usable Go toolchain (need go $want)" >&2
	exit 1
fi
