package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// portServer serves, on the sandbox's loopback only: HTTP on 8000
// (/tmp/www's files, and /headers: the request's path and headers as
// JSON) and a WebSocket echo on 8001 ("echo: " before each message). It
// prints "ready" once both listen.
const portServer = `
import base64, functools, hashlib, http.server, json, os, socket, threading
os.makedirs('/tmp/www', exist_ok=True)
open('/tmp/www/hello.txt', 'w').write('hello from ' + os.environ.get('PORT_TEST_MARK', ''))
class H(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith('/headers'):
            b = json.dumps({'path': self.path, 'headers': dict(self.headers)}).encode()
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(b)))
            self.end_headers()
            self.wfile.write(b)
            return
        return super().do_GET()
    def log_message(self, *a):
        pass
def ws(c):
    try:
        echo(c)
    finally:
        c.close()
def echo(c):
    data = b''
    while b'\r\n\r\n' not in data:
        d = c.recv(4096)
        if not d:
            return
        data += d
    keys = [l.split(b':', 1)[1].strip() for l in data.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key:')]
    if not keys:
        c.sendall(b'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n')
        return
    key = keys[0]
    acc = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + acc + b'\r\n\r\n')
    f = c.makefile('rb')
    while True:
        h = f.read(2)
        if len(h) < 2:
            return
        op, n = h[0] & 15, h[1] & 127
        if n == 126:
            n = int.from_bytes(f.read(2), 'big')
        mask = f.read(4) if h[1] & 128 else b'\0\0\0\0'
        p = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8:
            return
        p = b'echo: ' + p
        c.sendall(bytes([128 | op, len(p)]) + p)
srv = http.server.ThreadingHTTPServer(('127.0.0.1', 8000), functools.partial(H, directory='/tmp/www'))
threading.Thread(target=srv.serve_forever, daemon=True).start()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', 8001))
l.listen(16)
print('ready', flush=True)
while True:
    c, _ = l.accept()
    threading.Thread(target=ws, args=(c,), daemon=True).start()
`

// A server listening on a sandbox's loopback is reached through the
// daemon, on either wall and in either network mode: over HTTP with the
// tenant's key or a port token (query, header, cookie), over WebSocket, and through airlock port-forward; neither the
// key nor the token reaches it. Another tenant's key, a token that is
// forged or minted for another sandbox or port, a port out of range all
// answer as a missing sandbox does; a paused sandbox and an empty port
// say so. Every connection is a port.connect record. The sandbox gains
// no way out: a proxy-mode sandbox still reaches neither a host the
// policy does not allow nor the host it runs on.
func TestPortsReachServersInside(t *testing.T) {
	forEachWall(t, portsReachServersInside)
}

func portsReachServersInside(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	ctx := context.Background()
	aliceKey, bobKey := tenantKey(t, d, "alice"), tenantKey(t, d, "bob")
	alice := d.client(t, aliceKey)

	modes := []struct {
		name string
		net  api.Network
	}{
		{"none", api.Network{}},
		{"proxy", api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}},
	}
	ids := make([]string, len(modes))
	for i, m := range modes {
		sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{TTL: "10m", Network: m.net, Env: map[string]string{"PORT_TEST_MARK": m.name}})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = sb.ID
		t.Cleanup(func() { _ = alice.Destroy(context.Background(), sb.ID) })
		startPortServer(t, alice, sb.ID)
	}
	// What the daemon listens on once the sandboxes are made (the
	// proxy-mode sandbox's proxy among it): reaching their ports adds
	// nothing.
	listening := listeners(t, d.cmd.Process.Pid)
	missing := "0123456789ab"
	notFound := func(id string) portAnswer {
		return portAnswer{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: fmt.Sprintf("no sandbox %q", id)}
	}
	// The reference: a missing sandbox, with alice's key.
	if got := portGet(t, d, aliceKey, "/v1/sandboxes/"+missing+"/ports/8000/hello.txt", nil); got != notFound(missing) {
		t.Fatalf("a missing sandbox: %+v", got)
	}

	for i, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			id := ids[i]
			root := "/v1/sandboxes/" + id + "/ports/8000"
			// The key.
			if got := portGet(t, d, aliceKey, root+"/hello.txt", nil); got.Status != 200 || got.Body != "hello from "+m.name {
				t.Errorf("with the key: %+v", got)
			}
			var seen struct {
				Path    string
				Headers map[string]string
			}
			got := portGet(t, d, aliceKey, root+"/headers?a=1&b=2", nil)
			if err := json.Unmarshal([]byte(got.Body), &seen); err != nil || seen.Path != "/headers?a=1&b=2" {
				t.Errorf("the sandbox saw %+v (%v)", got, err)
			}
			for k, v := range seen.Headers {
				if strings.Contains(v, aliceKey) || strings.EqualFold(k, "Authorization") {
					t.Errorf("the key reached the sandbox: %s: %s", k, v)
				}
			}
			// A token: in the query, a cookie, the header.
			tok, err := alice.MintPortToken(ctx, id, 8000, "10m")
			if err != nil {
				t.Fatal(err)
			}
			if want := root + "/?airlock_token="; !strings.HasPrefix(tok.URL, want) {
				t.Errorf("token url %q, want %s...", tok.URL, want)
			}
			q := portGetFull(t, d, "", root+"/headers?airlock_token="+tok.Token+"&x=1", nil)
			if q.Status != 200 || !strings.Contains(q.Body, `"path": "/headers?x=1"`) || strings.Contains(q.Body, tok.Token) {
				t.Errorf("a token in the query: %+v", q)
			}
			// No cookie on the origin every sandbox's ports share.
			if c := q.Header.Get("Set-Cookie"); c != "" {
				t.Errorf("the API's front set a cookie: %q", c)
			}
			if got := portGet(t, d, "", root+"/headers", map[string]string{"Cookie": "app=1; airlock_port_token=" + tok.Token}); got.Status != 200 || strings.Contains(got.Body, tok.Token) || !strings.Contains(got.Body, "app=1") {
				t.Errorf("a token in a cookie: %+v", got)
			}
			if got := portGet(t, d, "", root+"/hello.txt", map[string]string{"X-Airlock-Port-Token": tok.Token}); got.Status != 200 {
				t.Errorf("a token in the header: %+v", got)
			}

			// Refused, as a missing sandbox is.
			// A character of the MAC's middle changed.
			mid := len(tok.Token) - 10
			forged := tok.Token[:mid] + map[bool]string{true: "A", false: "B"}[tok.Token[mid] != 'A'] + tok.Token[mid+1:]
			other := ids[(i+1)%len(ids)]
			refusals := map[string]struct {
				key, path, id string
				hdr           map[string]string
			}{
				"another tenant's key":           {bobKey, root + "/hello.txt", id, nil},
				"a forged token":                 {"", root + "/hello.txt?airlock_token=" + forged, id, nil},
				"a token for another port":       {"", "/v1/sandboxes/" + id + "/ports/8001/?airlock_token=" + tok.Token, id, nil},
				"a token for another sandbox":    {"", "/v1/sandboxes/" + other + "/ports/8000/hello.txt", other, map[string]string{"X-Airlock-Port-Token": tok.Token}},
				"another tenant's key and token": {bobKey, root + "/hello.txt", id, map[string]string{"X-Airlock-Port-Token": forged}},
				"port 0":                         {aliceKey, "/v1/sandboxes/" + id + "/ports/0/", id, nil},
				"port 65536":                     {aliceKey, "/v1/sandboxes/" + id + "/ports/65536/", id, nil},
				"port 08000":                     {aliceKey, "/v1/sandboxes/" + id + "/ports/08000/", id, nil},
			}
			for name, c := range refusals {
				if got := portGet(t, d, c.key, c.path, c.hdr); got != notFound(c.id) {
					t.Errorf("%s: %+v, want %+v", name, got, notFound(c.id))
				}
			}
			if _, err := d.client(t, bobKey).MintPortToken(ctx, id, 8000, ""); code(err) != api.CodeNotFound {
				t.Errorf("bob mints a token for alice's sandbox: %v", err)
			}
			// Nothing listens on 8002.
			if got := portGet(t, d, aliceKey, "/v1/sandboxes/"+id+"/ports/8002/", nil); got.Code != api.CodeUnavailable {
				t.Errorf("an empty port: %+v", got)
			}

			// WebSocket, with the token in the query.
			if got := wsEcho(t, d, "/v1/sandboxes/"+id+"/ports/8001/ws?airlock_token=", id, alice, "ping "+m.name); got != "echo: ping "+m.name {
				t.Errorf("websocket echo: %q", got)
			}

			// airlock port prints the URL and the token.
			r := cliOf(d, aliceKey)(t, "port", id, "8000")
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if r.code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], root+"/?airlock_token=") {
				t.Fatalf("airlock port: %s", r)
			}
			if got := portGet(t, d, "", strings.Replace(lines[0], "/?", "/hello.txt?", 1), nil); got.Status != 200 || got.Body != "hello from "+m.name {
				t.Errorf("airlock port's URL: %+v", got)
			}
			if got := portGet(t, d, "", root+"/hello.txt", map[string]string{"X-Airlock-Port-Token": lines[1]}); got.Status != 200 {
				t.Errorf("airlock port's token: %+v", got)
			}

			portForward(t, d, aliceKey, id, "hello from "+m.name)

			// Paused: said so.
			if _, err := alice.Pause(ctx, id); err != nil {
				t.Fatal(err)
			}
			if got := portGet(t, d, aliceKey, root+"/hello.txt", nil); got.Code != api.CodeFailedPrecondition {
				t.Errorf("a paused sandbox: %+v", got)
			}
			if _, err := alice.Resume(ctx, id); err != nil {
				t.Fatal(err)
			}

			// Every connection is recorded, with its door and its proof.
			recs, err := alice.Audit(ctx, id, "port.connect")
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]int{}
			for _, rec := range recs {
				var pc struct {
					Port       int
					Door, Auth string
				}
				_ = json.Unmarshal(rec.Data, &pc)
				kinds[fmt.Sprintf("%d %s %s", pc.Port, pc.Door, pc.Auth)]++
			}
			for _, k := range []string{"8000 api key", "8000 api token", "8001 api token", "8002 api key", "8000 forward key"} {
				if kinds[k] == 0 {
					t.Errorf("no port.connect record %q among %v", k, kinds)
				}
			}

			if m.net.Mode == "proxy" {
				noWayOut(t, alice, id)
			}
			// With a WebSocket open, the daemon listens on nothing new.
			conn, _ := wsOpen(t, d, "/v1/sandboxes/"+id+"/ports/8001/ws?airlock_token=", id, alice)
			if now := listeners(t, d.cmd.Process.Pid); !slices.Equal(now, listening) {
				t.Errorf("the daemon listens on %v, before it reached any port %v", now, listening)
			}
			conn.Close()
		})
	}
}

// tenantKey creates a tenant and returns its key.
func tenantKey(t *testing.T, d *daemonProc, name string) string {
	t.Helper()
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: name, Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	return tn.Key
}

// startPortServer starts portServer in sandbox id and returns once it
// listens.
func startPortServer(t *testing.T, c *client.Client, id string) {
	t.Helper()
	st, err := c.ExecStream(context.Background(), id, &api.Exec{Cmd: []string{"python3", "-u", "-c", portServer}, Background: true, Tag: "ports"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Next()
	st.Close()
	if err != nil || ev.PID == 0 {
		t.Fatalf("the server in %s: %v %+v", id, err, ev)
	}
	logs, err := c.Logs(context.Background(), id, ev.PID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var out bytes.Buffer
	for !strings.Contains(out.String(), "ready") {
		ev, err := logs.Next()
		if err != nil || ev.End != nil {
			t.Fatalf("the server in %s: %v %+v\n%s", id, err, ev, out.String())
		}
		out.Write(ev.Stdout)
		out.Write(ev.Stderr)
	}
}

// portAnswer is what the port front answered: an API error's code and
// message, or the body.
type portAnswer struct {
	Status        int
	Code          api.Code
	Message, Body string
}

type portFull struct {
	portAnswer
	Header http.Header
}

func portGet(t *testing.T, d *daemonProc, key, path string, hdr map[string]string) portAnswer {
	t.Helper()
	return portGetFull(t, d, key, path, hdr).portAnswer
}

// portGetFull is GET path on the daemon's socket with key (if any) and
// the headers hdr, following no redirect.
func portGetFull(t *testing.T, d *daemonProc, key, path string, hdr map[string]string) portFull {
	t.Helper()
	hc := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", d.sock)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequest("GET", "http://airlock"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	out := portFull{portAnswer: portAnswer{Status: res.StatusCode}, Header: res.Header}
	var e api.Error
	if res.Header.Get("Content-Type") == "application/json" && json.Unmarshal(b, &e) == nil && e.Code != "" {
		out.Code, out.Message = e.Code, e.Message
		return out
	}
	out.Body = string(b)
	return out
}

// wsEcho sends msg over a WebSocket to path + a fresh token for port 8001
// of id, on the daemon's socket, and returns the answer.
func wsEcho(t *testing.T, d *daemonProc, path, id string, c *client.Client, msg string) string {
	t.Helper()
	conn, br := wsOpen(t, d, path, id, c)
	defer conn.Close()
	mask := []byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | byte(len(msg))}
	frame = append(frame, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	h := make([]byte, 2)
	if _, err := io.ReadFull(br, h); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, h[1]&0x7f)
	if _, err := io.ReadFull(br, p); err != nil {
		t.Fatal(err)
	}
	return string(p)
}

// wsOpen opens a WebSocket to path + a fresh token for port 8001 of id,
// on the daemon's socket.
func wsOpen(t *testing.T, d *daemonProc, path, id string, c *client.Client) (net.Conn, *bufio.Reader) {
	t.Helper()
	tok, err := c.MintPortToken(context.Background(), id, 8001, "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET %s%s HTTP/1.1\r\nHost: airlock\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", path, tok.Token)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		b, _ := io.ReadAll(res.Body)
		conn.Close()
		t.Fatalf("websocket handshake: %s %v %s", res.Status, res.Header, b)
	}
	return conn, br
}

// listeners are the TCP sockets process pid listens on (v4 and v6), by
// their local address, sorted.
func listeners(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if in, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(in, "]")] = true
		}
	}
	var out []string
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if fs := strings.Fields(line); len(fs) > 9 && fs[3] == "0A" && inodes[fs[9]] {
				out = append(out, f+" "+fs[1])
			}
		}
	}
	slices.Sort(out)
	return out
}

// portForward runs airlock port-forward from a free local port to 8000
// of id, fetches hello.txt through it, and ends it with SIGINT.
func portForward(t *testing.T, d *daemonProc, key, id, want string) {
	t.Helper()
	cmd := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", d.data, "port-forward", id, "0:8000")
	cmd.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock, "AIRLOCK_API_KEY="+key)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, _, ok := strings.Cut(strings.TrimPrefix(line, "Forwarding from "), " -> ")
	if err != nil || !ok {
		t.Fatalf("port-forward said %q (%v): %s", line, err, errb.String())
	}
	for range 2 { // two connections, one after the other
		res, err := http.Get("http://" + addr + "/hello.txt")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != want {
			t.Errorf("through port-forward: %s %q", res.Status, b)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("port-forward after Ctrl-C: %v: %s", err, errb.String())
	}
}

// noWayOut checks that proxy-mode sandbox id reaches neither a host its
// policy does not allow (through its proxy) nor a port of the host it
// runs on (directly, at its proxy's address), though its servers are
// reached from outside.
func noWayOut(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf(`
import os, socket, urllib.parse, urllib.request, urllib.error
host = urllib.parse.urlparse(os.environ.get('HTTP_PROXY') or os.environ['http_proxy']).hostname
try:
    socket.create_connection((host, %d), timeout=3)
    print('direct:open')
except Exception:
    print('direct:blocked')
try:
    urllib.request.urlopen('http://denied.test/', timeout=10)
    print('proxy:open')
except urllib.error.HTTPError as e:
    print('proxy:%%d' %% e.code)
except Exception as e:
    print('proxy:error', e)
`, port)
	out, errs, end := run(t, c, id, &api.Exec{Cmd: []string{"python3", "-c", script}})
	if end.ExitCode != 0 || !strings.Contains(out, "direct:blocked") || strings.Contains(out, "proxy:open") || strings.Contains(out, "proxy:2") {
		t.Errorf("the sandbox found a way out: %s %s", out, errs)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's listener accepted %d connections from the sandbox", n)
	}
}
