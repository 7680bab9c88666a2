package sandbox

import (
	"github.com/airlock-sandbox/airlock/internal/sandbox/core"
	"github.com/prometheus/client_golang/prometheus"
)

// The service's names that its parts define, where its callers find them.

// Host is one sandbox as the host keeps it (*lifecycle.Sandbox).
type Host = core.Host

// Backend makes and adopts sandboxes on the host (the lifecycle:
// NewBackend).
type Backend = core.Backend

// Config configures the service.
type Config = core.Config

// NodeConfig describes the node a daemon runs on, and the capacity it
// holds sandboxes to.
type NodeConfig = core.NodeConfig

// Metrics are the service's Prometheus metrics.
type Metrics = core.Metrics

// NewMetrics makes the metrics and registers them with reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics { return core.NewMetrics(reg) }

// Caps and defaults (see where each is defined).
const (
	MaxTTL                        = core.MaxTTL
	DefaultMaxBackground          = core.DefaultMaxBackground
	DefaultMaxBackgroundPerTenant = core.DefaultMaxBackgroundPerTenant
	AgentProtocol                 = core.AgentProtocol
	MaxEgressRecords              = core.MaxEgressRecords
)
