#!/bin/sh
# Build the Kubernetes control plane the k8s module's real-cluster tests
# (k8s/e2e) run against — kube-apiserver and etcd, at the exact versions
# third_party/kube pins, verified against the module hashes its go.sum
# records — and install both into a directory (default
# /usr/local/lib/airlock/kube; an argument names another), which the tests
# find through AIRLOCK_KUBE_BIN. The build (~14 min cold on 2 cores, well
# under a minute with a warm build cache) is skipped when the installed
# binaries are the ones this script built from the same pins: a stamp in
# the directory records the pins and each binary's sha256.
#   sudo ./scripts/kube.sh [DIR]
set -eu
cd "$(dirname "$0")/.."
. scripts/go-env.sh
dest=${1:-/usr/local/lib/airlock/kube}
# The pins: "<module> <version> <h1 hash>" of kube-apiserver's and etcd's
# modules in third_party/kube/go.sum.
pins=$(awk '($1 == "k8s.io/kubernetes" || $1 == "go.etcd.io/etcd/server/v3") && $2 !~ /\/go.mod$/ { print $1 " " $2 " " $3 }' third_party/kube/go.sum | sort)
version=$(echo "$pins" | awk '$1 == "k8s.io/kubernetes" { print $2 }')
case "$version" in v1.*) ;; *) echo "airlock: no k8s.io/kubernetes pin in third_party/kube/go.sum" >&2; exit 1 ;; esac
case "$pins" in *go.etcd.io/etcd/server/v3*) ;; *) echo "airlock: no go.etcd.io/etcd/server/v3 pin in third_party/kube/go.sum" >&2; exit 1 ;; esac
stamp="$dest/kube.stamp"
sums() { for b in kube-apiserver etcd; do echo "$b sha256:$(sha256sum "$1/$b" | cut -d' ' -f1)"; done; }
if [ -x "$dest/kube-apiserver" ] && [ -x "$dest/etcd" ] && [ -f "$stamp" ] &&
	[ "$(cat "$stamp")" = "$(printf '%s\n%s\n' "$pins" "$(sums "$dest")")" ]; then
	echo "airlock: kube-apiserver $version and etcd are installed in $dest" >&2
	exit 0
fi
echo "airlock: building kube-apiserver $version and etcd (minutes; a quarter of an hour with a cold build cache)" >&2
mkdir -p "$dest"
tmp=$(mktemp -d "$dest/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Without -X the server reports v0.0.0-master+$Format:%H$, which clients'
# discovery cannot parse. The build date is the release's, so that the same
# pin builds the same binary.
v=k8s.io/component-base/version
minor=${version#v1.}
minor=${minor%%.*}
(
	cd third_party/kube
	export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
	date=$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
	nice -n 10 go build -trimpath -o "$tmp/kube-apiserver" -ldflags="-s -w -X $v.gitVersion=$version \
		-X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.gitCommit=$version \
		-X $v.buildDate=$date" k8s.io/kubernetes/cmd/kube-apiserver
	nice -n 10 go build -trimpath -ldflags='-s -w' -o "$tmp/etcd" go.etcd.io/etcd/server/v3
)
chmod 0755 "$tmp/kube-apiserver" "$tmp/etcd"
mv -f "$tmp/kube-apiserver" "$tmp/etcd" "$dest/"
printf '%s\n%s\n' "$pins" "$(sums "$dest")" > "$stamp"
echo "airlock: installed kube-apiserver $version and etcd in $dest" >&2
