// Package agentpbconnect is the generated Connect client and handler of
// the agent service (api/proto/agent).
package agentpbconnect
