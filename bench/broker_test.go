package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/test/fakenet"
)

// BenchmarkBrokerInterception measures, in one sandbox, what TLS
// interception for a granted host costs against a plain tunnel to a host
// without a grant: HTTPS GETs on a kept-alive connection (the proxy
// inspects and re-sends each request) and on a new connection each (two
// TLS handshakes instead of one, the proxy's upstream one pooled).
func BenchmarkBrokerInterception(b *testing.B) {
	fi := fakenet.New(b)
	ws := b.TempDir()
	helper, _ := os.ReadFile(attackBin)
	_ = os.WriteFile(filepath.Join(ws, "attack"), helper, 0o755)
	world, _ := os.ReadFile(fi.CAFile)
	_ = os.WriteFile(filepath.Join(ws, "world-ca.pem"), world, 0o644)
	// The proxy verifies api.test against the fake world's CA.
	b.Setenv("SSL_CERT_FILE", fi.CAFile)
	b.Setenv("AIRLOCK_BENCH_SECRET", "bench-secret-value")
	const n = 500
	script := fmt.Sprintf(`cat /etc/airlock/ca.pem /workspace/world-ca.pem > /tmp/ca.pem
for mode in keepalive fresh; do
  echo "intercepted $mode $(/workspace/attack tlsloop https://api.test/x %d /tmp/ca.pem $mode TOK)"
  echo "tunnel $mode $(/workspace/attack tlsloop https://allowed.test/x %d /tmp/ca.pem $mode TOK)"
done`, n, n)
	b.ResetTimer()
	out := inHost(b, fi, "run", "--dns-upstream", "192.0.2.53:53", "--workspace", ws, "--allow", "allowed.test",
		"--grant", "k@api.test GET:/** env=TOK", "--secret", "k=env:AIRLOCK_BENCH_SECRET", "--", "sh", "-c", script)
	res := map[string][3]float64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var kind, mode string
		var med, p99, rps float64
		if _, err := fmt.Sscanf(line, "%s %s MEDIAN_US %f P99_US %f RPS %f", &kind, &mode, &med, &p99, &rps); err != nil {
			b.Fatalf("%q: %v\n%s", line, err, out)
		}
		res[kind+"-"+mode] = [3]float64{med, p99, rps}
	}
	for _, mode := range []string{"keepalive", "fresh"} {
		in, tu := res["intercepted-"+mode], res["tunnel-"+mode]
		b.ReportMetric(in[0]/1000, mode+"-intercepted-p50-ms")
		b.ReportMetric(tu[0]/1000, mode+"-tunnel-p50-ms")
		b.ReportMetric((in[0]-tu[0])/1000, mode+"-added-p50-ms")
		b.ReportMetric(in[0]/tu[0], mode+"-ratio")
		b.Logf("%s: intercepted p50 %.2f ms p99 %.2f ms (%.0f req/s); tunnel p50 %.2f ms p99 %.2f ms (%.0f req/s); added p50 %.2f ms (%.2fx)",
			mode, in[0]/1000, in[1]/1000, in[2], tu[0]/1000, tu[1]/1000, tu[2], (in[0]-tu[0])/1000, in[0]/tu[0])
	}
	b.ReportMetric(0, "ns/op")
}
