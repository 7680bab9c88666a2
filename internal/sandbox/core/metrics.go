package core

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the service's Prometheus metrics.
type Metrics struct {
	Sandboxes      *prometheus.GaugeVec
	Creates        prometheus.Counter
	CreatesRefused prometheus.Counter
	CreateFailures prometheus.Counter
	CreateSeconds  prometheus.Histogram
	Adopted        prometheus.Counter
	Ends           *prometheus.CounterVec
	Execs          prometheus.Counter
	ExecSeconds    prometheus.Histogram
	LimitKills     *prometheus.CounterVec
	// Egress counts the egress proxies' decisions (allowed, denied, error).
	Egress *prometheus.CounterVec
	// Pools: the sandboxes they are to hold (size) and hold ready (made,
	// frozen), creates that took one (hits) or named or matched a pool
	// with none ready (misses), and the time to make a pooled sandbox.
	PoolSize     prometheus.Gauge
	PoolReady    prometheus.Gauge
	PoolHits     prometheus.Counter
	PoolMisses   prometheus.Counter
	PoolFillSecs prometheus.Histogram
}

// NewMetrics makes the metrics and registers them with reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Sandboxes:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "airlock_sandboxes", Help: "Live sandboxes by state."}, []string{"state"}),
		Creates:        prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandbox_creates_total", Help: "Sandboxes created."}),
		CreatesRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandbox_creates_refused_total", Help: "Creates refused by a quota."}),
		CreateFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandbox_create_failures_total", Help: "Creates that failed."}),
		CreateSeconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "airlock_sandbox_create_seconds", Help: "Time to create a sandbox.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
		Adopted:        prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_sandboxes_adopted_total", Help: "Sandboxes adopted after a daemon restart."}),
		Ends:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_sandbox_ends_total", Help: "Sandboxes ended, by reason."}, []string{"reason"}),
		Execs:          prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_execs_total", Help: "Commands started in sandboxes."}),
		ExecSeconds:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: "airlock_exec_seconds", Help: "Wall time of foreground commands, request to exit.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}),
		LimitKills:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_limit_kills_total", Help: "Sandboxes or commands ended by a limit (memory, pids, ttl, idle, timeout, cpu_budget)."}, []string{"limit"}),
		Egress:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_egress_decisions_total", Help: "Egress proxy decisions."}, []string{"decision"}),
		PoolSize:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "airlock_pool_size_sandboxes", Help: "Pooled sandboxes the pools are to hold (their sizes), all pools."}),
		PoolReady:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "airlock_pool_ready_sandboxes", Help: "Pooled sandboxes made ahead and ready, all pools."}),
		PoolHits:       prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_pool_hits_total", Help: "Creates that took a pooled sandbox."}),
		PoolMisses:     prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_pool_misses_total", Help: "Creates that named or matched a pool with no sandbox ready."}),
		PoolFillSecs:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "airlock_pool_refill_seconds", Help: "Time to make one pooled sandbox, ready and frozen.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
	}
	if reg != nil {
		reg.MustRegister(m.Sandboxes, m.Creates, m.CreatesRefused, m.CreateFailures, m.CreateSeconds, m.Adopted, m.Ends, m.Execs, m.ExecSeconds, m.LimitKills, m.Egress, m.PoolSize, m.PoolReady, m.PoolHits, m.PoolMisses, m.PoolFillSecs)
	}
	return m
}
