package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Bounds on POST /files. File bodies are streamed to the sandbox, never
// held whole: the sandbox's disk bounds what one holds; these bound one
// request.
const (
	maxUploadBytes = 16 << 30 // one request's body, all its files
	maxUploadFiles = 1000     // files of one multipart request
)

// fileUser is the user a /files request acts as: its username query, else
// its basic authorization's.
func fileUser(r *http.Request) (string, error) {
	if u := r.URL.Query().Get("username"); u != "" {
		return u, nil
	}
	return userOf(r.Header)
}

// download streams a file of the sandbox (GET /files?path=&username=).
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	t, err := target(r.Context())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	user, err := fileUser(r)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		writeErr(w, http.StatusBadRequest, "path is missing")
		return
	}
	out := &lazyWriter{w: w, start: func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	}}
	if err := h.svc.ReadFile(r.Context(), t.Principal, t.ID, p, user, out, 0); err != nil {
		if out.started {
			// The status is sent: cut the body short, so the client
			// cannot take a part for the whole.
			panic(http.ErrAbortHandler)
		}
		writeErr(w, httpStatus(err), err.Error())
		return
	}
	if !out.started {
		out.start(w) // an empty file
		w.WriteHeader(http.StatusOK)
	}
}

// lazyWriter sends its headers (start) with the first byte written.
type lazyWriter struct {
	w       http.ResponseWriter
	start   func(http.ResponseWriter)
	started bool
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	if !l.started {
		l.started = true
		l.start(l.w)
	}
	return l.w.Write(b)
}

// written is one file of an upload's answer.
type written struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"`
}

// upload writes files into the sandbox (POST /files?path=&username=):
// multipart/form-data parts named "file", each to the path query or, when
// absent, its file name (directories included, relative ones taken from
// the user's home); or an octet-stream body to the path query. Either may
// be gzip-encoded as a whole (Content-Encoding). Parents are made. The
// answer names each file with its path as the sandbox resolved it.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	t, err := target(r.Context())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	user, err := fileUser(r)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-metadata-") {
			writeErr(w, http.StatusBadRequest, "file metadata (X-Metadata-*) is not supported")
			return
		}
	}
	body := io.Reader(http.MaxBytesReader(w, r.Body, maxUploadBytes))
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			writeErr(w, http.StatusBadRequest, "gzip: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("content encoding %q: want gzip or none", enc))
		return
	}
	dest := r.URL.Query().Get("path")
	write := func(p string, rd io.Reader) (written, error) {
		resolved, err := h.svc.WriteFileAt(r.Context(), t.Principal, t.ID, p, user, 0o644, rd, true)
		if err != nil {
			return written{}, err
		}
		if resolved == "" { // the sandbox did not say
			if !path.IsAbs(p) {
				return written{}, errdefs.New(errdefs.ErrInternal, p+" was written, but the sandbox did not report where")
			}
			resolved = path.Clean(p)
		}
		return written{Name: path.Base(resolved), Path: resolved, Type: "file"}, nil
	}
	var out []written
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		out, err = h.uploadParts(multipart.NewReader(body, params["boundary"]), dest, write)
	} else {
		if dest == "" {
			writeErr(w, http.StatusBadRequest, "path is missing")
			return
		}
		var one written
		one, err = write(dest, body)
		out = []written{one}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeErr(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request's body is larger than %d bytes", int64(maxUploadBytes)))
			return
		}
		writeErr(w, httpStatus(err), err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// uploadParts writes each "file" part of a multipart upload.
func (h *Handler) uploadParts(mr *multipart.Reader, dest string, write func(string, io.Reader) (written, error)) ([]written, error) {
	out := []written{}
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errdefs.Invalid("multipart: " + err.Error())
		}
		if part.FormName() != "file" {
			continue
		}
		if len(out) >= maxUploadFiles {
			return nil, errdefs.Invalid(fmt.Sprintf("more than %d files in one request", maxUploadFiles))
		}
		p := dest
		if p == "" {
			// The raw file name: it names the directories too (Go's
			// Part.FileName keeps only the last element).
			_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if err != nil || params["filename"] == "" {
				return nil, errdefs.Invalid("a file part has no file name, and the request no path")
			}
			p = params["filename"]
		}
		if seen[p] {
			return nil, errdefs.Invalid(fmt.Sprintf("%s is written twice in one request", p))
		}
		seen[p] = true
		wr, err := write(p, part)
		if err != nil {
			return nil, err
		}
		out = append(out, wr)
	}
	if len(out) == 0 {
		return nil, errdefs.Invalid(`no part named "file"`)
	}
	return out, nil
}
