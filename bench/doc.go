// Package bench measures airlock side by side with its peers, in one run,
// and reports ratios (go test -bench . ./bench/, as root). It drives the
// airlock binary like a user would and imports nothing of airlock.
package bench
