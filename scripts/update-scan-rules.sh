#!/bin/sh
# Refresh internal/scan's rules from a gitleaks release (the maintained
# rule set the scanner applies). Review the diff, run the tests, commit.
#   ./scripts/update-scan-rules.sh v8.30.1
set -eu
cd "$(dirname "$0")/.."
version=${1:?usage: $0 GITLEAKS_VERSION (e.g. v8.30.1)}
. scripts/go-env.sh
dir=$(go mod download -json "github.com/zricethezav/gitleaks/v8@$version" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
install -m 0644 "$dir/config/gitleaks.toml" internal/scan/rules/gitleaks.toml
install -m 0644 "$dir/LICENSE" internal/scan/rules/LICENSE
sed -i "s/^const RuleSet = .*/const RuleSet = \"gitleaks $version default rules\"/" internal/scan/scan.go
sed -i 's/(v[0-9.]*'"'"'s `gitleaks.toml`/('"$version"''"'"'s `gitleaks.toml`/' docs/credentials.md
# rules.go is the TOML as Go, which the binary carries instead of parsing it.
go test ./internal/scan -run TestEmbeddedRulesAreTheTOML -update
echo "rules of gitleaks $version in internal/scan/rules; now: go test ./internal/scan ./internal/broker" >&2
