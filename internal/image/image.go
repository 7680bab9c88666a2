// Package image resolves what a sandbox's root filesystem is made of
// (Store.Resolve): the host image or a root filesystem directory
// (internal/image/rootfs), or an OCI image (layout, docker-archive,
// registry) unpacked once (internal/image/unpack) into a content-addressed
// cache with its own ownership and shared read-only by every sandbox that
// uses it. A pull says what it fetches from where, tells a registry's or
// the network's failures apart by class, and reports its progress to the
// sink its context carries. It imports its subpackages,
// go-containerregistry, internal/errdefs, internal/editdist,
// internal/progress and x/sys.
package image
