package workspace

// Report is what changed in a workspace as a record lists it: each change
// with the digest of its new contents, and what the reading left out.
type Report struct {
	Changes   []Reported
	Unread    []string // what the walk could not read, and why
	Truncated string   // why Changes stops short ("" when whole)
}

// Reported is one change of a Report.
type Reported struct {
	Path   string `json:"path"`
	Kind   string `json:"kind"` // added, modified, deleted
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"` // new contents of a regular file
}

// Report lists s's changes, each file's new contents digested (Digest).
func (s *Set) Report() *Report {
	out := &Report{Truncated: s.Truncated}
	for _, c := range s.Changes {
		out.Changes = append(out.Changes, Reported{Path: c.Path, Kind: string(c.Kind), Type: c.Type, Size: c.Size, SHA256: s.Digest(c)})
	}
	for _, u := range s.Unread {
		out.Unread = append(out.Unread, u.String())
	}
	return out
}
