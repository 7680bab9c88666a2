// Command airlock-node registers one `airlock serve` daemon with the
// cluster: the Secret <namespace>/airlock-node-<name> holding the daemon's
// admin key, and the AirlockNode <name> saying where the daemon answers
// (endpoint, CA) and which runtime classes it serves. It re-applies both
// every 30 s (unless --once), so an edit or a deletion is put right. It
// runs beside the daemon (the DaemonSet's sidecar) so that the daemon
// itself never links Kubernetes libraries (docs/kubernetes.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock-node:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		o          registration
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig file (default: in-cluster)")
		keyFile    = flag.String("admin-key-file", "/var/lib/airlock/admin.key", "the daemon's admin key")
		caFile     = flag.String("ca-file", "", "PEM CA that signed the daemon's TLS certificate (https endpoints)")
		classes    = flag.String("runtime-classes", "airlock", "comma-separated RuntimeClass names the node serves")
		once       = flag.Bool("once", false, "apply once and exit")
		every      = flag.Duration("interval", 30*time.Second, "how often to re-apply")
	)
	flag.StringVar(&o.Name, "name", "", "the AirlockNode's name (default: the host name)")
	flag.StringVar(&o.Endpoint, "endpoint", "", "where the daemon answers: unix:///path or https://host:port")
	flag.StringVar(&o.Namespace, "namespace", "airlock-system", "namespace of the admin-key Secret")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if o.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return err
		}
		o.Name = h
	}
	for c := range strings.SplitSeq(*classes, ",") {
		if c = strings.TrimSpace(c); c != "" {
			o.RuntimeClasses = append(o.RuntimeClasses, c)
		}
	}
	if err := o.validateFlags(); err != nil {
		return err
	}
	// The key and CA are read on every pass: beside a daemon that is
	// starting for the first time, the key file comes a moment later, and
	// either file may be replaced.
	load := func() error {
		key, err := os.ReadFile(*keyFile)
		if err != nil {
			return err
		}
		o.AdminKey = strings.TrimSpace(string(key))
		o.CABundle = nil
		if *caFile != "" {
			if o.CABundle, err = os.ReadFile(*caFile); err != nil {
				return err
			}
		}
		return o.validate()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *once {
		if err := load(); err != nil {
			return err
		}
		return o.apply(ctx, kube, dyn)
	}
	t := time.NewTicker(*every)
	defer t.Stop()
	for {
		err := load()
		if err == nil {
			err = o.apply(ctx, kube, dyn)
		}
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			log.Error("register", "node", o.Name, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
