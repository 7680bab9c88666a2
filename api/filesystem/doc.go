// Package filesystem is the generated Go code of api/proto/filesystem: the
// in-sandbox agent's filesystem service, shaped on the wire like E2B envd's.
package filesystem
