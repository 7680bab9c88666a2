package system

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

// The names airlock gives the logs it keeps under RunStateDir: a run's
// file under runs/ (openRunAudit), an `airlock mcp` session's directory
// under mcp/. Nothing else there is touched. Compiled at first use, not
// at every start of airlock.
var (
	runLogName     = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\d{8}T\d{6}\.\d{9}Z\.audit$`) })
	mcpSessionName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\d{8}T\d{6}Z-[0-9a-f]{8}$`) })
)

// PruneLogs removes the runs' logs and the MCP sessions' directories
// under RunStateDir that nothing has written to for olderThan (a session
// still serving writes its log), and names what it removed. A log given
// its own path (--audit FILE) is the user's and is never looked at.
func PruneLogs(olderThan time.Duration) ([]string, error) {
	cutoff := time.Now().Add(-olderThan)
	var removed []string
	var errs []error
	prune := func(dir string, name *regexp.Regexp, isDir bool) {
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			// Lstat's type: a link or anything else of that name is not ours.
			if !name.MatchString(e.Name()) || e.IsDir() != isDir || !e.IsDir() && !e.Type().IsRegular() {
				continue
			}
			newest, err := newestWrite(p)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if newest.After(cutoff) {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, p)
		}
	}
	prune(filepath.Join(RunStateDir(), "runs"), runLogName(), false)
	prune(filepath.Join(RunStateDir(), "mcp"), mcpSessionName(), true)
	return removed, errors.Join(errs...)
}

// newestWrite is the latest modification time of p or of anything below
// it, links not followed.
func newestWrite(p string) (time.Time, error) {
	var newest time.Time
	err := filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
		return nil
	})
	return newest, err
}
