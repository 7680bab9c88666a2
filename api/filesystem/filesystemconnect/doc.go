// Package filesystemconnect is the generated Connect client and handler of
// the filesystem service (api/proto/filesystem).
package filesystemconnect
