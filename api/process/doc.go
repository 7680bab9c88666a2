// Package process is the generated Go code of api/proto/process: the
// in-sandbox agent's process service, shaped on the wire like E2B envd's.
package process
