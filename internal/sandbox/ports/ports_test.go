package ports

import (
	"net"
	"testing"
	"time"
)

// Bytes moving on a relayed connection mark its sandbox active, at most
// once a second, both ways; a read or write of nothing does not.
func TestTrafficKeepsTheSandboxActive(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	clock := time.Unix(1_800_000_000, 0)
	var marks []time.Time
	c := &active{conn: &conn{Conn: a, r: a}, now: func() time.Time { return clock }, touch: func(t time.Time) { marks = append(marks, t) }}
	defer c.Close()
	go func() {
		buf := make([]byte, 8)
		for {
			if _, err := b.Read(buf); err != nil {
				return
			}
		}
	}()
	write := func() {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	write()
	write() // the same second: no second mark
	clock = clock.Add(999 * time.Millisecond)
	write()
	clock = clock.Add(time.Millisecond)
	go func() { _, _ = b.Write([]byte("y")) }()
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(nil); err != nil {
		t.Fatal(err)
	}
	want := []time.Time{time.Unix(1_800_000_000, 0), time.Unix(1_800_000_001, 0)}
	if len(marks) != len(want) || !marks[0].Equal(want[0]) || !marks[1].Equal(want[1]) {
		t.Errorf("marks %v, want %v", marks, want)
	}
}
