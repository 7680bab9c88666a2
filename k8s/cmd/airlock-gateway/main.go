// Command airlock-gateway is airlock's data plane on Kubernetes: it
// forwards /v1/namespaces/{ns}/sandboxes/{name}/... to the daemon that
// holds the Sandbox, for callers whose bearer token the apiserver accepts
// and whose RBAC allows the subresource (docs/kubernetes.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/k8s/internal/gateway"
	"k8s.io/client-go/kubernetes"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock-gateway:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		listen    = flag.String("listen", ":8443", "address to serve on")
		tlsCert   = flag.String("tls-cert", "", "TLS certificate (PEM); without it and --tls-key the gateway serves plain HTTP, on a loopback address only")
		tlsKey    = flag.String("tls-key", "", "TLS key (PEM)")
		namespace = flag.String("namespace", "airlock-system", "namespace of the Secret airlock-master")
		reviewTTL = flag.Duration("review-ttl", 10*time.Second, "how long a TokenReview or SubjectAccessReview answer is reused")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if *tlsCert == "" {
		host, _, err := net.SplitHostPort(*listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("--listen %s without TLS: plain HTTP only on a loopback address (bearer tokens would cross the network in the clear)", *listen)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// --kubeconfig is controller-runtime's flag (its config package, which
	// the node packages link, registers it): a file, else $KUBECONFIG, else
	// in-cluster.
	cfg, err := ctrlconfig.GetConfig()
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The informers live as long as the gateway: they stop when the
	// context given them ends (a context cancelled once they had synced
	// left the gateway with the Sandboxes of its start, and a 404 for
	// every one made later).
	dir, err := gateway.NewInformerDirectory(ctx, cfg)
	if err != nil {
		return err
	}
	gw := gateway.New(gateway.Config{
		Kube:      kube,
		Directory: dir,
		Master:    gateway.SecretMaster(kube, *namespace),
		ReviewTTL: *reviewTTL,
		Log:       log,
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	log.Info("airlock-gateway serving", "addr", ln.Addr().String(), "tls", *tlsCert != "")
	if *tlsCert != "" {
		err = srv.ServeTLS(ln, *tlsCert, *tlsKey)
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
