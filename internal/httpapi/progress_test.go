package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/progress"
)

// A create's progress stream carries its reports as they come, then the
// sandbox or, once begun, the error that ended it with its API code; an
// error before any report is the ordinary error reply.
func TestCreateStreamEndsWithTheSandboxOrItsError(t *testing.T) {
	notFound := errdefs.New(errdefs.ErrNotFound, "--image x: no such tag")
	for _, c := range []struct {
		name    string
		report  bool
		err     error
		lines   []string
		refused bool
	}{
		{"made", true, nil, []string{`{"progress":{"op":"pull","layer":1,"layers":2,"bytes":5,"total":9}}`, `{"sandbox":{"id":"sb1"`}, false},
		{"failed midway", true, notFound, []string{`{"progress":{"op":"pull","layer":1,"layers":2,"bytes":5,"total":9}}`, `{"error":{"code":"not_found","message":"--image x: no such tag"}}`}, false},
		{"refused at once", false, notFound, nil, true},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v1/sandboxes?progress=true", nil)
		err := createStream(w, r, func(ctx context.Context) (*api.Sandbox, error) {
			if c.report {
				progress.Report(ctx, progress.Event{Op: "pull", Layer: 1, Layers: 2, Bytes: 5, Total: 9})
			}
			if c.err != nil {
				return nil, c.err
			}
			return &api.Sandbox{ID: "sb1"}, nil
		})
		if c.refused {
			if !errors.Is(err, errdefs.ErrNotFound) || w.Body.Len() != 0 {
				t.Errorf("%s: %v, body %q: want the error back for the ordinary reply", c.name, err, w.Body.String())
			}
			continue
		}
		if err != nil || w.Code != 200 || w.Header().Get("Content-Type") != "application/x-ndjson" {
			t.Errorf("%s: %v, HTTP %d %s", c.name, err, w.Code, w.Header().Get("Content-Type"))
		}
		lines := strings.Split(strings.TrimSpace(w.Body.String()), "\n")
		if len(lines) != len(c.lines) {
			t.Errorf("%s: lines %q", c.name, lines)
			continue
		}
		for i, want := range c.lines {
			if !strings.HasPrefix(lines[i], want) || !json.Valid([]byte(lines[i])) {
				t.Errorf("%s: line %d %q, want %q", c.name, i, lines[i], want)
			}
		}
	}
}

// A snapshot's progress stream has the same shape: its reports, then the
// snapshot, or the error that ended it under its API code.
func TestSnapshotStreamEndsWithTheSnapshotOrItsError(t *testing.T) {
	for _, c := range []struct {
		err  error
		last string
	}{
		{nil, `{"snapshot":{"id":"sn1",`},
		{context.Canceled, `{"error":{"code":`},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v1/sandboxes/sb1/snapshot?progress=true", nil)
		err := snapshotStream(w, r, func(ctx context.Context) (*api.Snapshot, error) {
			progress.Report(ctx, progress.Event{Op: "snapshot", Subject: "sb1", Bytes: 7})
			if c.err != nil {
				return nil, c.err
			}
			return &api.Snapshot{ID: "sn1"}, nil
		})
		lines := strings.Split(strings.TrimSpace(w.Body.String()), "\n")
		if err != nil || len(lines) != 2 || lines[0] != `{"progress":{"op":"snapshot","subject":"sb1","bytes":7}}` || !strings.HasPrefix(lines[1], c.last) {
			t.Errorf("%v: %v, lines %q", c.err, err, lines)
		}
	}
}
