package api

// Resources are amounts of a node's capacity: CPUs, memory, sandboxes.
type Resources struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	Sandboxes   int     `json:"sandboxes"`
}

// NodePool is one tenant pool on a node, as GET /v1/node shows it.
type NodePool struct {
	Tenant  string `json:"tenant"`
	Name    string `json:"name"`
	Size    int    `json:"size"`
	Ready   int    `json:"ready"`
	Filling int    `json:"filling"`
}

// AuditHead is the last record of the daemon's audit chain.
type AuditHead struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// Node is what a daemon tells a cluster about itself (GET /v1/node).
type Node struct {
	Name       string     `json:"name"`
	Version    string     `json:"version"`
	BootID     string     `json:"boot_id"`
	Capacity   Resources  `json:"capacity"`
	Allocated  Resources  `json:"allocated"`
	Isolations []string   `json:"isolations"`
	Pools      []NodePool `json:"pools"`
	AuditHead  *AuditHead `json:"audit_head,omitempty"`
	Rev        uint64     `json:"rev"`
}

// NodeEvent is one line of GET /v1/node/events.
type NodeEvent struct {
	Rev     uint64    `json:"rev"`
	Type    string    `json:"type"` // "hello" (first line, Node set), "sandbox.created", "sandbox.ended", "pool", "capacity", "heartbeat"
	Node    *Node     `json:"node,omitempty"`
	Sandbox *Sandbox  `json:"sandbox,omitempty"`
	Pool    *NodePool `json:"pool,omitempty"`
}

// ListSandboxes filters GET /v1/sandboxes: by external id, and with the
// admin key, every tenant's (All).
type ListSandboxes struct {
	ExternalID string
	All        bool
}
