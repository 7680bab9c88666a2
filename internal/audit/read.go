package audit

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"time"
)

// Read calls fn for every record of the log in dir, in order; with follow
// it goes on with what is appended until ctx ends. It does not verify
// (Verify does); a torn last line waits for the rest.
func Read(ctx context.Context, dir string, follow bool, fn func(*Record) error) error {
	done := map[string]int64{} // segment -> bytes read
	for {
		segs, err := Segments(dir)
		if err != nil {
			return err
		}
		for _, p := range segs {
			n, err := readSegment(p, done[p], fn)
			done[p] = n
			if err != nil {
				return err
			}
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func readSegment(p string, from int64, fn func(*Record) error) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return from, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return from, err
	}
	rd := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return from, nil
		}
		from += int64(len(line))
		var r Record
		if json.Unmarshal(line, &r) != nil {
			continue
		}
		if err := fn(&r); err != nil {
			return from, err
		}
	}
}
