package agent

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// PortUpgrade is the protocol the host asks for, with HTTP's Upgrade, on
// GET /airlock/port/{port}: once the agent answers 101, the connection
// carries the bytes of one TCP connection the agent made to
// 127.0.0.1:{port} inside the sandbox, both ways, half-closes included.
// The agent dials from the sandbox's own network (its namespace on the
// container wall, the Sentry's netstack on gVisor), so a server that
// listens on the sandbox's loopback is reached and the sandbox gains no
// path out.
const PortUpgrade = "airlock-port"

// portDialTimeout bounds the agent's dial of a port inside the sandbox.
const portDialTimeout = 10 * time.Second

// relayPort serves GET /airlock/port/{port}.
func relayPort(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, "port: want 1-65535", http.StatusBadRequest)
		return
	}
	if r.Header.Get("Upgrade") != PortUpgrade {
		http.Error(w, "want Upgrade: "+PortUpgrade, http.StatusBadRequest)
		return
	}
	// Not r's context: the server cancels it when the host half-closes,
	// which a client that sends all and then waits for its answer does
	// right behind the request.
	d := net.Dialer{Timeout: portDialTimeout}
	c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer c.Close()
	hc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer hc.Close()
	_ = hc.SetDeadline(time.Time{}) // the server's, for reading the request
	if _, err := io.WriteString(hc, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+PortUpgrade+"\r\n\r\n"); err != nil {
		return
	}
	// What the host sent after its request is already in brw's buffer.
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, brw.Reader)
		closeWrite(c)
		close(done)
	}()
	_, _ = io.Copy(hc, c)
	closeWrite(hc)
	<-done
}

// closeWrite half-closes c where it can (TCP, unix), so that the other
// end reads its end of stream while answers still flow back.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
