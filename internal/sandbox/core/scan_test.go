package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

const pastedKey = "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"

// Each policy does what it says with a credential in a call, and every
// finding is recorded by rule and fingerprint, never by value.
func TestScanPolicies(t *testing.T) {
	for _, policy := range []string{"block", "redact", "record"} {
		a := &memAudit{}
		s := New(Config{Audit: record.New(a, nil), Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
		argv := []string{"curl", "-H", "Authorization: token " + pastedKey, "https://api.github.com"}
		fields := []Field{}
		for i := range argv {
			fields = append(fields, Field{Where: "argv", Val: &argv[i]})
		}
		err := s.ScanCall(context.Background(), &tenant.Principal{Tenant: "t", ScanPolicy: policy}, record.Who{Tenant: "t"}, "exec", fields)
		switch policy {
		case "block":
			if !errors.Is(err, errdefs.ErrSecretDetected) || !strings.Contains(err.Error(), "github-pat") || strings.Contains(err.Error(), pastedKey) {
				t.Errorf("block: %v", err)
			}
		case "redact":
			if err != nil || strings.Contains(argv[2], pastedKey) || !strings.Contains(argv[2], "[REDACTED:github-pat]") || argv[0] != "curl" {
				t.Errorf("redact: %v %q", err, argv)
			}
		case "record":
			if err != nil || !strings.Contains(argv[2], pastedKey) {
				t.Errorf("record: %v %q", err, argv)
			}
		}
		if len(a.Recs) == 0 {
			t.Fatalf("%s: no finding recorded", policy)
		}
		for _, r := range a.Recs {
			if r.Kind != "secret.finding" || strings.Contains(string(r.Data), pastedKey) || !strings.Contains(string(r.Data), `"fingerprint":"hmac:`) {
				t.Errorf("%s: record %s %s", policy, r.Kind, r.Data)
			}
		}
	}
}

// A clean call costs no record; placeholders are not credentials.
func TestScanLeavesCleanCallsAlone(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil), Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
	vals := []string{"go", "test", "./...", "GITHUB_TOKEN=alk_" + strings.Repeat("eyJzYngiOiJhYmMifQ", 3) + "." + strings.Repeat("A", 43)}
	fields := []Field{}
	for i := range vals {
		fields = append(fields, Field{Where: "argv", Val: &vals[i]})
	}
	if err := s.ScanCall(context.Background(), &tenant.Principal{Tenant: "t"}, record.Who{}, "exec", fields); err != nil || len(a.Recs) != 0 {
		t.Errorf("%v, %d records", err, len(a.Recs))
	}
}

// Regression (issue 12, item 9): a blocked write of 179 KB of credentials
// made 9,344 fsynced records. A call records at most MaxFindingRecords
// findings and one summary that counts the rest.
func TestScanFindingsPerCallAreCapped(t *testing.T) {
	for _, policy := range []string{"block", "redact", "record"} {
		a := &memAudit{}
		s := New(Config{Audit: record.New(a, nil), Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
		var sb strings.Builder
		r := rand.New(rand.NewPCG(1, 2))
		const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
		for sb.Len() < 30_000 {
			sb.WriteString("ghp_")
			for range 36 {
				sb.WriteByte(alnum[r.IntN(len(alnum))])
			}
			sb.WriteByte('\n')
		}
		text := sb.String()
		err := s.ScanCall(context.Background(), &tenant.Principal{Tenant: "t", ScanPolicy: policy}, record.Who{Tenant: "t"}, "write", []Field{{Where: "file /w", Val: &text}})
		if policy == "block" != errors.Is(err, errdefs.ErrSecretDetected) {
			t.Fatalf("%s: %v", policy, err)
		}
		kinds := map[string]int{}
		var sum struct {
			Found    int `json:"findings"`
			Recorded int `json:"findings_recorded"`
			Dropped  int `json:"findings_dropped"`
		}
		for _, r := range a.Recs {
			kinds[r.Kind]++
			if r.Kind == "secret.scan_summary" {
				_ = json.Unmarshal(r.Data, &sum)
			}
		}
		if kinds["secret.finding"] != MaxFindingRecords || kinds["secret.scan_summary"] != 1 || len(a.Recs) != MaxFindingRecords+1 {
			t.Fatalf("%s: records %v", policy, kinds)
		}
		if sum.Found < 500 || sum.Recorded != MaxFindingRecords || sum.Dropped != sum.Found-MaxFindingRecords {
			t.Errorf("%s: summary %+v", policy, sum)
		}
		if policy == "redact" && strings.Contains(text, "ghp_") {
			t.Errorf("redact left a credential in the scanned part")
		}
	}
}

// Regression (issue 12, item 9): a 4 MiB write cost seconds of the
// daemon's CPU. A call's values are read up to MaxScanBytes in all; the
// summary names what was read only in part, a finding in the part read
// says so, and redaction leaves the unread rest as it was.
func TestScanReadsAtMostMaxScanBytesPerCall(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil), Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
	filler := strings.Repeat("x", MaxScanBytes-100)
	first := filler + " " + pastedKey + " " + strings.Repeat("y", 4<<20)
	second := pastedKey // nothing left of the budget: unread
	vals := []string{first, second}
	err := s.ScanCall(context.Background(), &tenant.Principal{Tenant: "t", ScanPolicy: "redact"}, record.Who{Tenant: "t"}, "exec",
		[]Field{{Where: "argv[0]", Val: &vals[0]}, {Where: "argv[1]", Val: &vals[1]}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(vals[0], pastedKey) || len(vals[0]) != len(first)-len(pastedKey)+len("[REDACTED:github-pat]") || vals[1] != pastedKey {
		t.Errorf("redaction: first holds the key %v, second %q", strings.Contains(vals[0], pastedKey), vals[1])
	}
	var sum struct {
		Read      int      `json:"scanned_bytes"`
		Total     int      `json:"bytes"`
		Unscanned []string `json:"partly_scanned"`
	}
	findings := 0
	for _, r := range a.Recs {
		switch r.Kind {
		case "secret.finding":
			findings++
			if !strings.Contains(string(r.Data), `"partly_scanned":true`) {
				t.Errorf("finding in a value read in part: %s", r.Data)
			}
		case "secret.scan_summary":
			_ = json.Unmarshal(r.Data, &sum)
		}
	}
	if findings != 1 || sum.Read != MaxScanBytes || sum.Total != len(first)+len(second) || !slices.Equal(sum.Unscanned, []string{"argv[0]", "argv[1]"}) {
		t.Errorf("%d findings, summary %+v", findings, sum)
	}
}

// An upload's files share one budget: past it, files are not read, and
// the summary says which.
func TestScanBudgetIsSharedByAnUpload(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil), Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
	bud := NewScanBudget()
	p := &tenant.Principal{Tenant: "t", ScanPolicy: "record"}
	for i := 0; i < 40; i++ {
		text := strings.Repeat("z", 4<<10)
		if err := s.ScanFields(context.Background(), p, record.Who{}, "upload", []Field{{Where: fmt.Sprintf("file /f%d", i), Val: &text}}, bud); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ScanSummary(context.Background(), record.Who{}, "upload", bud); err != nil {
		t.Fatal(err)
	}
	if bud.read != MaxScanBytes || len(bud.unscanned) != 40-MaxScanBytes/(4<<10) || len(a.Recs) != 1 || a.Recs[0].Kind != "secret.scan_summary" {
		t.Errorf("read %d, unscanned %v, %d records", bud.read, bud.unscanned, len(a.Recs))
	}
}

// A streamed file is scanned by its head (More): it counts as read in
// part even when the head fits the budget, a finding in it says so, and
// the summary counts the rest the stream carried unread (Unread).
func TestScanOfAStreamedHead(t *testing.T) {
	a := &memAudit{}
	s := New(Config{Audit: record.New(a, nil), Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
	bud := NewScanBudget()
	head := "token " + pastedKey + "\n"
	p := &tenant.Principal{Tenant: "t", ScanPolicy: "redact"}
	if err := s.ScanFields(context.Background(), p, record.Who{}, "write", []Field{{Where: "file /big", Val: &head, More: true}}, bud); err != nil {
		t.Fatal(err)
	}
	bud.Unread(90 << 20)
	if err := s.ScanSummary(context.Background(), record.Who{}, "write", bud); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(head, pastedKey) {
		t.Error("the head was not redacted")
	}
	var sum struct {
		Read   int      `json:"scanned_bytes"`
		Total  int      `json:"bytes"`
		Partly []string `json:"partly_scanned"`
	}
	var partlyFinding bool
	for _, r := range a.Recs {
		switch r.Kind {
		case "secret.finding":
			partlyFinding = strings.Contains(string(r.Data), `"partly_scanned":true`)
		case "secret.scan_summary":
			_ = json.Unmarshal(r.Data, &sum)
		}
	}
	n := len("token " + pastedKey + "\n")
	if !partlyFinding || sum.Read != n || sum.Total != n+90<<20 || !slices.Equal(sum.Partly, []string{"file /big"}) {
		t.Errorf("finding partly scanned %v, summary %+v", partlyFinding, sum)
	}
}

// FuzzScanCallIsBounded: whatever a call carries, the scanner reads at
// most MaxScanBytes of it, makes at most MaxFindingRecords findings and
// one summary, and redaction leaves what it did not read as it was.
func FuzzScanCallIsBounded(f *testing.F) {
	f.Add("curl -H", "token "+pastedKey, 1000, 3)
	f.Add(pastedKey+" ", pastedKey, MaxScanBytes/len(pastedKey)+3, 2)
	f.Add("api_key=Zx81QmPq7RkT2vLw\n", "", 5000, 1)
	s := New(Config{Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
	f.Fuzz(func(t *testing.T, a, b string, repeat, nfields int) {
		repeat, nfields = max(1, repeat%20000), max(1, nfields%8)
		a = strings.Repeat(a, min(repeat, 2*MaxScanBytes/max(1, len(a))))
		vals := make([]string, nfields)
		orig := make([]string, nfields)
		fields := make([]Field, nfields)
		for i := range vals {
			vals[i] = []string{a, b}[i%2]
			orig[i] = vals[i]
			fields[i] = Field{Where: fmt.Sprintf("argv[%d]", i), Val: &vals[i]}
		}
		audit := &memAudit{}
		s.Cfg.Audit = record.New(audit, nil)
		bud := NewScanBudget()
		if err := s.ScanFields(context.Background(), &tenant.Principal{Tenant: "t", ScanPolicy: "redact"}, record.Who{}, "exec", fields, bud); err != nil {
			t.Fatal(err)
		}
		if err := s.ScanSummary(context.Background(), record.Who{}, "exec", bud); err != nil {
			t.Fatal(err)
		}
		if bud.read > MaxScanBytes || len(audit.Recs) > MaxFindingRecords+1 {
			t.Fatalf("read %d bytes, made %d records", bud.read, len(audit.Recs))
		}
		left := MaxScanBytes
		for i := range vals {
			n := min(len(orig[i]), left)
			left -= n
			if !strings.HasSuffix(vals[i], orig[i][n:]) {
				t.Fatalf("field %d: the unread rest was changed", i)
			}
		}
	})
}

// Under record the call went on unchanged, and so did its exec.start
// record: argv kept the pasted key. The copy a record keeps is redacted
// whatever the policy; the finding names it by fingerprint.
func TestRecordsKeepNoCredentialWhateverThePolicy(t *testing.T) {
	const aws = "AKIAQ4ZT6WX2LR7NPJ3V"
	for _, policy := range []string{"redact", "record"} {
		a := &memAudit{}
		s := New(Config{Audit: record.New(a, nil), Broker: broker.New(broker.Config{Keys: keys.Ephemeral()})})
		argv := []string{"aws", "--key", aws, "-H", "Authorization: token " + pastedKey, "s3", "ls"}
		shown := slices.Clone(argv)
		fields := []Field{}
		for i := range argv {
			fields = append(fields, Field{Where: fmt.Sprintf("argv[%d]", i), Val: &argv[i], Shown: &shown[i]})
		}
		if err := s.ScanCall(context.Background(), &tenant.Principal{Tenant: "t", ScanPolicy: policy}, record.Who{Tenant: "t"}, "exec", fields); err != nil {
			t.Fatal(err)
		}
		if sent := strings.Join(argv, " "); strings.Contains(sent, aws) != (policy == "record") {
			t.Errorf("%s: the command runs with %q", policy, sent)
		}
		kept := strings.Join(shown, " ")
		if strings.Contains(kept, aws) || strings.Contains(kept, pastedKey) || !strings.Contains(kept, "[REDACTED:aws-access-token]") || !strings.Contains(kept, "[REDACTED:github-pat]") || shown[0] != "aws" {
			t.Errorf("%s: the record keeps %q", policy, kept)
		}
		if len(a.Recs) != 2 {
			t.Errorf("%s: %d findings recorded", policy, len(a.Recs))
		}
		for _, r := range a.Recs {
			if strings.Contains(string(r.Data), aws) || strings.Contains(string(r.Data), pastedKey) || !strings.Contains(string(r.Data), `"fingerprint":"hmac:`) {
				t.Errorf("%s: record %s", policy, r.Data)
			}
		}
	}
}
