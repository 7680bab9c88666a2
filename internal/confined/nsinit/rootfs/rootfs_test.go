package rootfs

import "testing"

// An overlay without an upper layer is read-only; every overlay uses user
// xattrs (trusted.* ones are out of reach in a user namespace).
func TestOverlayOpts(t *testing.T) {
	for _, c := range []struct{ lower, upper, work, want string }{
		{"/s/gen:/s/image", "", "", "lowerdir=/s/gen:/s/image,userxattr"},
		{"/s/ws/lower", "/s/ws/upper", "/s/ws/work", "lowerdir=/s/ws/lower,upperdir=/s/ws/upper,workdir=/s/ws/work,userxattr"},
	} {
		if got := overlayOpts(c.lower, c.upper, c.work); got != c.want {
			t.Errorf("overlayOpts(%q, %q, %q) = %q, want %q", c.lower, c.upper, c.work, got, c.want)
		}
	}
}
