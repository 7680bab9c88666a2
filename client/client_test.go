package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// A run of execs, each read to its end event, goes over one connection to
// the daemon, not one each: the daemon flushes the end event and only then
// closes the response, and a stream closed before that close is read cost
// the connection.
func TestExecsKeepTheirConnection(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "airlock.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	endRead := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"pid":7}` + "\n"))
		w.(http.Flusher).Flush()
		_, _ = w.Write([]byte(`{"end":{"exit_code":3}}` + "\n"))
		w.(http.Flusher).Flush()
		<-endRead // the response's close comes after the end, apart
	})}
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(func() { srv.Close() })

	c, err := New(Config{Address: sock, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		s, err := c.ExecStream(context.Background(), "sb", &api.Exec{Cmd: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		end, err := Drain(s, nil, nil)
		if err != nil || end.ExitCode != 3 {
			t.Fatalf("exec %d: %+v, %v", i, end, err)
		}
		endRead <- struct{}{}
		s.Close()
	}
	if n := cl.n.Load(); n != 1 {
		t.Fatalf("the daemon accepted %d connections for 5 execs, want 1", n)
	}
}

// A node event stream reads each line as an event, and its error line as
// the daemon's error; a stream cut without one is unexpected.
func TestNodeEventsEndWithTheDaemonsError(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "airlock.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var cut atomic.Bool
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/node/events" || r.URL.Query().Get("heartbeat") != "250ms" {
			http.Error(w, `{"code":"not_found","message":"`+r.URL.String()+`"}`, 404)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"rev":1,"type":"hello","node":{"name":"n"}}` + "\n" + `{"rev":3,"type":"heartbeat"}` + "\n"))
		if !cut.Load() {
			_, _ = w.Write([]byte(`{"rev":4,"type":"error","error":{"code":"quota_exceeded","message":"fell behind"}}` + "\n"))
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	c, err := New(Config{Address: sock, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	for _, cutShort := range []bool{false, true} {
		cut.Store(cutShort)
		s, err := c.NodeEvents(context.Background(), 250*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		hello, err := s.Next()
		if err != nil || hello.Type != api.NodeEventHello || hello.Node.Name != "n" {
			t.Fatalf("hello %+v, %v", hello, err)
		}
		if hb, err := s.Next(); err != nil || hb.Type != api.NodeEventHeartbeat || hb.Rev != 3 {
			t.Fatalf("heartbeat %+v, %v", hb, err)
		}
		_, err = s.Next()
		var ae *api.Error
		switch {
		case cutShort && !errors.Is(err, io.ErrUnexpectedEOF):
			t.Errorf("a stream cut short: %v", err)
		case !cutShort && (!errors.As(err, &ae) || ae.Code != api.CodeQuotaExceeded):
			t.Errorf("a stream ended by the daemon: %v", err)
		}
		s.Close()
	}
}
