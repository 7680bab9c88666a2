package system

import (
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The E2B listener serves plain HTTP only where no other machine can
// reach it: a loopback address. Anywhere else it needs TLS (its own pair
// or the API's), as --tcp does.
func TestE2BListenerNeedsTLSOffLoopback(t *testing.T) {
	for _, c := range []struct {
		o  Options
		ok bool
	}{
		{Options{E2B: E2BOptions{Listen: "127.0.0.1:3000"}}, true},
		{Options{E2B: E2BOptions{Listen: "[::1]:3000"}}, true},
		{Options{E2B: E2BOptions{Listen: "localhost:3000"}}, true},
		{Options{E2B: E2BOptions{Listen: "127.0.0.2:3000"}}, true},
		{Options{E2B: E2BOptions{Listen: ":3000"}}, false},
		{Options{E2B: E2BOptions{Listen: "0.0.0.0:3000"}}, false},
		{Options{E2B: E2BOptions{Listen: "10.1.2.3:3000"}}, false},
		{Options{E2B: E2BOptions{Listen: "example.com:443"}}, false},
		{Options{E2B: E2BOptions{Listen: ":443", TLSCert: "c.pem", TLSKey: "k.pem"}}, true},
		{Options{E2B: E2BOptions{Listen: ":443"}, TLSCert: "c.pem", TLSKey: "k.pem"}, true},
		{Options{E2B: E2BOptions{Listen: ":443", TLSCert: "c.pem"}}, false},
	} {
		err := c.o.check()
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("%+v: %v", c.o.E2B, err)
		}
	}
}
