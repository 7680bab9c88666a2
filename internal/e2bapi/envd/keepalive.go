package envd

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// Keep-alives of a stream: envd sends one every Keepalive-Ping-Interval
// seconds (the SDKs ask 50), so a stream of a quiet command or watch is
// not taken for dead by an HTTP client's or a proxy's idle timeout (the
// JS SDK's undici gives up on a body silent for 300 s).
const (
	defaultKeepalive = 30 * time.Second
	minKeepalive     = time.Second
	maxKeepalive     = time.Hour
)

// keepaliveInterval is the interval a request asks, within bounds.
func keepaliveInterval(h interface{ Get(string) string }) time.Duration {
	s, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || s <= 0 {
		return defaultKeepalive
	}
	return min(max(time.Duration(s)*time.Second, minKeepalive), maxKeepalive)
}

// keepAlive wraps a stream's send: sends are serialized, and from the
// first one on (a stream's first event must be its start) alive is sent
// every interval. stop ends the keep-alives; no send happens after it.
func keepAlive[T any](ctx context.Context, interval time.Duration, send func(*T) error, alive *T) (locked func(*T) error, stop func()) {
	var mu sync.Mutex
	var once sync.Once
	var wg sync.WaitGroup
	done := make(chan struct{})
	locked = func(m *T) error {
		mu.Lock()
		err := send(m)
		mu.Unlock()
		if err == nil {
			once.Do(func() {
				wg.Add(1)
				go func() {
					defer wg.Done()
					t := time.NewTicker(interval)
					defer t.Stop()
					for {
						select {
						case <-t.C:
							mu.Lock()
							err := send(alive)
							mu.Unlock()
							if err != nil {
								return
							}
						case <-done:
							return
						case <-ctx.Done():
							return
						}
					}
				}()
			})
		}
		return err
	}
	return locked, func() {
		once.Do(func() {}) // none starts from now on
		close(done)
		wg.Wait()
	}
}
