// Package agentpb is the generated Go code of api/proto/agent: airlock's
// own agent calls (version, file contents).
package agentpb
