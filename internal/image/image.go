// Package image resolves what a sandbox's root filesystem is made of: the
// host image (a read-only view of the host's system directories), a root
// filesystem directory, or an OCI image (layout, docker-archive, registry)
// unpacked once into a content-addressed cache with its own ownership and
// shared read-only by every sandbox that uses it.
package image
