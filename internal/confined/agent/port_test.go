package agent

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
)

// A relayed connection carries what the host sent right behind its
// request (already in the server's buffer), passes the host's half-close
// on to the server inside, and brings the server's answer back after it.
func TestRelayCarriesBufferedBytesAndHalfCloses(t *testing.T) {
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		c, err := srv.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the host's half-close
		_, _ = c.Write([]byte("got " + string(b)))
	}()
	port := srv.Addr().(*net.TCPAddr).Port

	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /airlock/port/{port}", relayPort)
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := "GET /airlock/port/" + strconv.Itoa(port) + " HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: " + PortUpgrade + "\r\n\r\n"
	if _, err := io.WriteString(c, req+"hello"); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.UnixConn).CloseWrite()
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Upgrade") != PortUpgrade {
		t.Fatalf("answer %v %v", res, err)
	}
	b, _ := io.ReadAll(br)
	if string(b) != "got hello" {
		t.Errorf("relayed %q", b)
	}

	// Nothing listening: 502, before any upgrade.
	srv.Close()
	c2, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, _ = io.WriteString(c2, req)
	res, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || res.StatusCode != http.StatusBadGateway {
		t.Errorf("an empty port: %v %v", res, err)
	}
}
