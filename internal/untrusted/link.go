package untrusted

import (
	"path"
	"strings"
)

// LinkInside reports whether a symlink that a sandbox made may be written
// at rel (slash-separated, relative to the root of a tree the host writes,
// under real directories only) with this target, such that it resolves
// inside the tree whatever the tree's other links are.
//
// A lexical check (clean the joined path, look for a leading "..") is not
// enough: the kernel resolves "d/.." by following d first, so with d -> .
// the target d/d/d/../../../.. climbs three levels above where it appears
// to. The rule here needs no knowledge of the tree: the target is relative,
// its ".." components all come before any name (a ".." after a name would
// step out of whatever that name is, possibly another link), and they climb
// no higher than the tree's root. Every link that passes resolves to a
// directory of the tree followed by names inside it, and by induction so
// does every link those names pass through.
func LinkInside(rel, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || strings.IndexByte(target, 0) >= 0 {
		return false
	}
	rel = path.Clean(rel)
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || strings.HasPrefix(rel, "/") {
		return false
	}
	up := strings.Count(rel, "/") // directories between the link and the root
	named := false
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if named || up == 0 {
				return false
			}
			up--
		default:
			named = true
		}
	}
	return true
}
