package files

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

type sent struct {
	n    int
	last bool
}

func pumpAll(t *testing.T, r io.Reader) (chunks []sent, dg record.Digest, n int64, rerr, serr error) {
	t.Helper()
	d := record.NewDigester()
	n, rerr, serr = pump(r, d, func(b []byte, last bool) error {
		chunks = append(chunks, sent{len(b), last})
		return nil
	})
	return chunks, d.Digest(), n, rerr, serr
}

// pump sends a body in chunks of streamChunk, only the last saying so
// (one empty chunk for an empty body), and digests what it sent.
func TestPumpChunksAndSaysLast(t *testing.T) {
	for _, size := range []int{0, 1, streamChunk, 2 * streamChunk, 2*streamChunk + 88} {
		body := bytes.Repeat([]byte("x"), size)
		chunks, dg, n, rerr, serr := pumpAll(t, iotestHalf{bytes.NewReader(body)})
		if rerr != nil || serr != nil || n != int64(size) {
			t.Fatalf("%d: %v %v %d", size, rerr, serr, n)
		}
		var want []sent
		for left := size; left > streamChunk; left -= streamChunk {
			want = append(want, sent{streamChunk, false})
		}
		want = append(want, sent{size - len(want)*streamChunk, true})
		if len(chunks) != len(want) {
			t.Fatalf("%d: chunks %v, want %v", size, chunks, want)
		}
		for i := range want {
			if chunks[i] != want[i] {
				t.Errorf("%d: chunks %v, want %v", size, chunks, want)
			}
		}
		sum := sha256.Sum256(body)
		if dg.Bytes != int64(size) || dg.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%d: digest %+v", size, dg)
		}
	}
}

// iotestHalf reads at most half of what is asked: pump fills its chunks
// whatever the reader's pace.
type iotestHalf struct{ r io.Reader }

func (h iotestHalf) Read(p []byte) (int, error) { return h.r.Read(p[:max(1, len(p)/2)]) }

// A body that fails is the caller's error, and its last chunk is never
// sent as last; the agent's failure is told apart.
func TestPumpTellsWhoseFailure(t *testing.T) {
	broken := io.MultiReader(bytes.NewReader(make([]byte, streamChunk+10)), errReader{errors.New("connection reset")})
	chunks, _, _, rerr, serr := pumpAll(t, broken)
	if !errors.Is(rerr, errdefs.ErrInvalidArgument) || serr != nil {
		t.Errorf("a broken body: %v %v", rerr, serr)
	}
	for _, c := range chunks {
		if c.last {
			t.Errorf("a broken body sent a last chunk: %v", chunks)
		}
	}
	agent := errors.New("no space left on device")
	_, rerr, serr = pump(bytes.NewReader(make([]byte, 3*streamChunk)), record.NewDigester(), func([]byte, bool) error { return agent })
	if rerr != nil || serr != agent {
		t.Errorf("the agent's failure: %v %v", rerr, serr)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// A head is text when it is valid UTF-8, but for a rune cut at its end
// when more of the file follows.
func TestIsText(t *testing.T) {
	euro := []byte("€") // three bytes
	for _, c := range []struct {
		head []byte
		more bool
		want bool
	}{
		{[]byte("plain"), false, true},
		{append([]byte("a"), euro[:2]...), true, true},
		{append([]byte("a"), euro[:2]...), false, false},
		{[]byte{0xff, 0xfe, 'a'}, true, false},
		{append([]byte{0xff}, euro[:1]...), true, false},
		{nil, false, true},
	} {
		if got := isText(c.head, c.more); got != c.want {
			t.Errorf("isText(%q, %v) = %v", c.head, c.more, got)
		}
	}
}
