package sandbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the service's Prometheus metrics.
type Metrics struct {
	sandboxes      *prometheus.GaugeVec
	creates        prometheus.Counter
	createsRefused prometheus.Counter
	createFailures prometheus.Counter
	createSeconds  prometheus.Histogram
	adopted        prometheus.Counter
	ends           *prometheus.CounterVec
	execs          prometheus.Counter
	execSeconds    prometheus.Histogram
	limitKills     *prometheus.CounterVec
	// Egress counts the egress proxies' decisions (allowed, denied, error).
	Egress *prometheus.CounterVec
}

// NewMetrics makes the metrics and registers them with reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sandboxes:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "airlock_sandboxes", Help: "Live sandboxes by state."}, []string{"state"}),
		creates:        prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandbox_creates_total", Help: "Sandboxes created."}),
		createsRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandbox_creates_refused_total", Help: "Creates refused by a quota."}),
		createFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandbox_create_failures_total", Help: "Creates that failed."}),
		createSeconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "airlock_sandbox_create_seconds", Help: "Time to create a sandbox.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
		adopted:        prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandboxes_adopted_total", Help: "Sandboxes adopted after a daemon restart."}),
		ends:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_sandbox_ends_total", Help: "Sandboxes ended, by reason."}, []string{"reason"}),
		execs:          prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_execs_total", Help: "Commands started in sandboxes."}),
		execSeconds:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: "airlock_exec_seconds", Help: "Wall time of foreground commands, request to exit.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}),
		limitKills:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_limit_kills_total", Help: "Sandboxes or commands ended by a limit (memory, pids, ttl, idle, timeout, cpu_budget)."}, []string{"limit"}),
		Egress:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_egress_decisions_total", Help: "Egress proxy decisions."}, []string{"decision"}),
	}
	if reg != nil {
		reg.MustRegister(m.sandboxes, m.creates, m.createsRefused, m.createFailures, m.createSeconds, m.adopted, m.ends, m.execs, m.execSeconds, m.limitKills, m.Egress)
	}
	return m
}
