// Command airlock-controller serves agent-sandbox's kinds (Sandbox,
// SandboxTemplate, SandboxWarmPool, SandboxClaim) for the runtime classes it
// owns on the cluster's airlock daemons (AirlockNodes): see
// docs/kubernetes.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/k8s/internal/controller"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock-controller:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		classes        = flag.String("runtime-classes", "airlock", "comma-separated runtimeClassNames whose Sandboxes, templates, pools and claims this controller serves")
		lostTimeout    = flag.Duration("node-lost-timeout", 2*time.Minute, "how long an airlock node is unreachable before it is lost (its Sandboxes Finished, NodeLost)")
		sweepInterval  = flag.Duration("sweep-interval", time.Minute, "time between two orphan sweeps of each node")
		sandboxWorkers = flag.Int("sandbox-workers", 32, "Sandboxes reconciled at once")
		claimWorkers   = flag.Int("claim-workers", 64, "SandboxClaims reconciled at once")
		poolWorkers    = flag.Int("warmpool-workers", 4, "SandboxWarmPools reconciled at once")
		masterSecret   = flag.String("master-secret", "airlock-system/airlock-master", "NAMESPACE/NAME of the Secret holding the tenant key master (made if missing)")
		metricsAddr    = flag.String("metrics-bind-address", "0", `address of the metrics endpoint ("0": none)`)
		leaderElect    = flag.Bool("leader-elect", false, "elect a leader among controller replicas (a Lease in the master secret's namespace)")
		qps            = flag.Float64("kube-api-qps", -1, "apiserver requests per second (-1: no client-side limit)")
		burst          = flag.Int("kube-api-burst", 1000, "apiserver request burst")
	)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	log := zap.New(zap.UseFlagOptions(&opts))
	ctrl.SetLogger(log)

	owned := controller.Classes{}
	for _, c := range strings.Split(*classes, ",") {
		if c = strings.TrimSpace(c); c != "" {
			owned[c] = true
		}
	}
	if len(owned) == 0 {
		return fmt.Errorf("--runtime-classes names no class")
	}
	ns, name, ok := strings.Cut(*masterSecret, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("--master-secret %q: want NAMESPACE/NAME", *masterSecret)
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, sandboxv1.AddToScheme, extv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  "0",
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "airlock-controller",
		LeaderElectionNamespace: ns,
		// The cache holds only the Secrets grants may name (labelled
		// airlock.dev/grant=true), not every Secret of the cluster; the
		// master and admin keys are read uncached.
		Cache: cache.Options{ByObject: controller.SecretCache()},
	})
	if err != nil {
		return err
	}
	tracker := nodes.New(nodes.Config{
		Client:        mgr.GetClient(),
		Reader:        mgr.GetAPIReader(),
		MasterSecret:  types.NamespacedName{Namespace: ns, Name: name},
		LostTimeout:   *lostTimeout,
		SweepInterval: *sweepInterval,
		Log:           log.WithName("nodes"),
	})
	if err := tracker.SetupWithManager(mgr); err != nil {
		return err
	}
	grants := &controller.GrantSecrets{Reader: mgr.GetClient(), Tenants: tracker, Nodes: tracker, Log: log.WithName("grantsecret")}
	if err := grants.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&controller.SandboxReconciler{
		Client: mgr.GetClient(), Nodes: tracker, Classes: owned, Grants: grants, Log: log.WithName("sandbox"),
	}).SetupWithManager(mgr, *sandboxWorkers); err != nil {
		return err
	}
	if err := controller.SetupPoolsAndClaims(context.Background(), mgr, controller.PoolsAndClaims{
		Nodes: tracker, Classes: owned, Grants: grants, PoolWorkers: *poolWorkers, ClaimWorkers: *claimWorkers, Log: log,
	}); err != nil {
		return err
	}

	log.Info("starting", "runtime-classes", *classes, "node-lost-timeout", *lostTimeout)
	return mgr.Start(ctrl.SetupSignalHandler())
}
