package editdist

import (
	"strings"
	"testing"
)

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"pypi", "pypi", 0},
		{"pipy", "pypi", 2},
		{"pyip", "pypi", 1}, // neighbours swapped
		{"npm", "nmp", 1},
		{"slm", "slim", 1},
		{"", "abc", 3},
		{"kitten", "sitting", 3},
		{strings.Repeat("a", Max+1), "a", Max + 1},
	} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%.10q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := Distance(c.b, c.a); got != c.want {
			t.Errorf("Distance(%q, %.10q) = %d, want %d (not symmetric)", c.b, c.a, got, c.want)
		}
	}
}
