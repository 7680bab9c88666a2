// Package processconnect is the generated Connect client and handler of
// the process service (api/proto/process).
package processconnect
