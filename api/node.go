package api

// ListSandboxes filters GET /v1/sandboxes: by external id, and with the
// admin key, every tenant's (All).
type ListSandboxes struct {
	ExternalID string
	All        bool
}
