// Package editdist measures how far apart two names are, for the "did you
// mean" of a typo (a preset's name, an image reference). It imports
// nothing of airlock.
package editdist

// Max is the longest name measured; a longer one is as far from anything
// as it is long, so that a name a caller chose costs a bounded look.
const Max = 256

// Distance is the optimal string alignment distance of a and b: the
// insertions, deletions and substitutions of bytes that make one the
// other, a swap of two neighbours counting one.
func Distance(a, b string) int {
	if len(a) > Max || len(b) > Max {
		return max(len(a), len(b))
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
