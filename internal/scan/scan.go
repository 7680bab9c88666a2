// Package scan finds credentials in text: command arguments, environment
// values, stdin and file contents given through the API, and the request
// headers and bodies the egress proxy can read. The rules are gitleaks'
// maintained rule set (rules/gitleaks.toml, refreshed by
// scripts/update-scan-rules.sh), translated ahead of time into rules.go
// (TestEmbeddedRulesAreTheTOML keeps it the file's rules; -update rewrites
// it), so that no process parses ~100 KB of TOML (~1.5 ms of CPU, and
// enough garbage for a collection in a short `airlock run`), and each
// rule's regexes compiled the first time its keywords are in a text (every
// rule has keywords: a scan of an ordinary command line compiles none, which
// would cost an `airlock run` ~20 ms). The engine applies what that file says: keywords as a prefilter,
// the rule's regex and secret group, its entropy floor, and the global and
// per-rule allowlists (regexes and stopwords; path allowlists do not apply
// to text that has no path).
package scan

import (
	"fmt"
	"math"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"sync"

	"github.com/pelletier/go-toml/v2"
)

// RuleSet names where the rules come from.
const RuleSet = "gitleaks v8.30.1 default rules"

// Finding is one credential found. Secret is the value itself: callers
// record Rule and a keyed fingerprint of it, never the value.
type Finding struct {
	Rule        string
	Description string
	Start, End  int // the secret's byte offsets in the scanned text
	Secret      string
}

// Scanner holds the rules. It is safe for concurrent use.
type Scanner struct {
	rules    []*rule
	global   []allowlist
	keywords []string // every rule's keywords, lower case, unique
}

type rule struct {
	id, description string
	secretGroup     int
	entropy         float64
	keywords        []string

	// What compile makes, once, from the rule file's regex and
	// allowlists (checked by New).
	src      fileRule
	compiled sync.Once
	re       *regexp.Regexp
	allow    []allowlist
}

type allowlist struct {
	target    string // "secret" (default), "match" or "line"
	and       bool
	regexes   []*regexp.Regexp
	stopwords []string
	paths     bool // has path conditions (never true for text without a path)
}

// The TOML file's shape (the parts that apply to text).
type fileAllowlist struct {
	RegexTarget string   `toml:"regexTarget"`
	Condition   string   `toml:"condition"`
	Regexes     []string `toml:"regexes"`
	StopWords   []string `toml:"stopwords"`
	Paths       []string `toml:"paths"`
}

type fileRule struct {
	ID          string          `toml:"id"`
	Description string          `toml:"description"`
	Regex       string          `toml:"regex"`
	SecretGroup int             `toml:"secretGroup"`
	Entropy     float64         `toml:"entropy"`
	Keywords    []string        `toml:"keywords"`
	Path        string          `toml:"path"`
	Allowlists  []fileAllowlist `toml:"allowlists"`
}

type file struct {
	Allowlist fileAllowlist `toml:"allowlist"`
	Rules     []fileRule    `toml:"rules"`
}

var (
	defaultOnce    sync.Once
	defaultScanner *Scanner
	defaultErr     error
)

// Default returns the scanner of the embedded rule set, compiling it on
// the first call.
func Default() (*Scanner, error) {
	// The embedded rules' expressions are not parsed here (~10 ms): a
	// test compiles every one of them
	// (TestRulesCompileWhenTheirKeywordsAppear).
	defaultOnce.Do(func() { defaultScanner, defaultErr = build(embeddedRules, false) })
	return defaultScanner, defaultErr
}

// New reads a gitleaks-format rule file, refusing one with an expression
// that does not compile.
func New(data []byte) (*Scanner, error) {
	f, err := parseFile(data)
	if err != nil {
		return nil, err
	}
	return build(f, true)
}

// parseFile reads a rule file.
func parseFile(data []byte) (file, error) {
	var f file
	if err := toml.Unmarshal(data, &f); err != nil {
		return f, fmt.Errorf("scan rules: %w", err)
	}
	return f, nil
}

// build makes the scanner of rule file f; check parses its expressions
// (what parses compiles: regexp.Compile fails only where syntax.Parse
// does).
func build(f file, check bool) (*Scanner, error) {
	s := &Scanner{}
	g, err := compileAllowlist(f.Allowlist)
	if err != nil {
		return nil, fmt.Errorf("scan rules: global allowlist: %w", err)
	}
	s.global = []allowlist{g}
	seen := map[string]bool{}
	for _, fr := range f.Rules {
		if fr.Regex == "" {
			continue // a rule on file paths alone
		}
		if err := parses(check, fr.ID, fr.Regex); err != nil {
			return nil, err
		}
		r := &rule{id: fr.ID, description: fr.Description, secretGroup: fr.SecretGroup, entropy: fr.Entropy, src: fr}
		for _, k := range fr.Keywords {
			k = strings.ToLower(k)
			r.keywords = append(r.keywords, k)
			if !seen[k] {
				seen[k] = true
				s.keywords = append(s.keywords, k)
			}
		}
		for _, fa := range fr.Allowlists {
			for _, x := range fa.Regexes {
				if err := parses(check, fr.ID, x); err != nil {
					return nil, err
				}
			}
		}
		s.rules = append(s.rules, r)
	}
	if len(s.rules) == 0 {
		return nil, fmt.Errorf("scan rules: no rules")
	}
	return s, nil
}

func parses(check bool, id, expr string) error {
	if !check {
		return nil
	}
	if _, err := syntax.Parse(expr, syntax.Perl); err != nil {
		return fmt.Errorf("scan rules: %s: %w", id, err)
	}
	return nil
}

// compile makes r's regex and allowlists, the first time it is called.
// load parsed every expression, or they are the embedded ones, which a
// test compiles: they compile.
func (r *rule) compile() {
	r.compiled.Do(func() {
		r.re = regexp.MustCompile(r.src.Regex)
		for _, fa := range r.src.Allowlists {
			a, err := compileAllowlist(fa)
			if err != nil {
				panic(fmt.Sprintf("scan rules: %s: %v", r.id, err)) // parsed by load
			}
			r.allow = append(r.allow, a)
		}
	})
}

func compileAllowlist(fa fileAllowlist) (allowlist, error) {
	a := allowlist{target: fa.RegexTarget, and: strings.EqualFold(fa.Condition, "AND"), paths: len(fa.Paths) > 0}
	for _, x := range fa.Regexes {
		re, err := regexp.Compile(x)
		if err != nil {
			return a, err
		}
		a.regexes = append(a.regexes, re)
	}
	for _, w := range fa.StopWords {
		a.stopwords = append(a.stopwords, strings.ToLower(w))
	}
	return a, nil
}

// Rules is how many rules the scanner applies.
func (s *Scanner) Rules() int { return len(s.rules) }

// Scan returns the credentials in text, in order of position; overlapping
// findings of several rules are all returned.
func (s *Scanner) Scan(text string) []Finding {
	if text == "" {
		return nil
	}
	lower := strings.ToLower(text)
	present := make(map[string]bool, 8)
	for _, k := range s.keywords {
		if strings.Contains(lower, k) {
			present[k] = true
		}
	}
	var out []Finding
	for _, r := range s.rules {
		if len(r.keywords) > 0 && !slices.ContainsFunc(r.keywords, func(k string) bool { return present[k] }) {
			continue
		}
		r.compile()
		for _, m := range r.re.FindAllStringSubmatchIndex(text, -1) {
			if f, ok := s.finding(r, text, m); ok {
				out = append(out, f)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int { return a.Start - b.Start })
	return out
}

// finding applies a rule's secret group, entropy floor and allowlists to
// one regex match (m: submatch indexes).
func (s *Scanner) finding(r *rule, text string, m []int) (Finding, bool) {
	ms, me := m[0], m[1]
	// A match never ends in the newline that closed it.
	for me > ms && text[me-1] == '\n' {
		me--
	}
	start, end := ms, me
	groups := len(m)/2 - 1
	switch {
	case r.secretGroup > 0 && r.secretGroup <= groups:
		start, end = m[2*r.secretGroup], m[2*r.secretGroup+1]
	case r.secretGroup > 0:
		return Finding{}, false
	default:
		for g := 1; g <= groups; g++ {
			if m[2*g] >= 0 && m[2*g+1] > m[2*g] {
				start, end = m[2*g], m[2*g+1]
				break
			}
		}
	}
	if start < 0 || end <= start {
		return Finding{}, false
	}
	f := Finding{Rule: r.id, Description: r.description, Start: start, End: end, Secret: text[start:end]}
	if r.entropy != 0 && Entropy(f.Secret) <= r.entropy {
		return Finding{}, false
	}
	match := text[ms:me]
	line := lineAround(text, ms, me)
	for _, lists := range [][]allowlist{s.global, r.allow} {
		for _, a := range lists {
			if a.allows(f.Secret, match, line) {
				return Finding{}, false
			}
		}
	}
	return f, true
}

func (a *allowlist) allows(secret, match, line string) bool {
	target := secret
	switch a.target {
	case "match":
		target = match
	case "line":
		target = line
	}
	regex := slices.ContainsFunc(a.regexes, func(re *regexp.Regexp) bool { return re.MatchString(target) })
	lower := strings.ToLower(secret)
	stop := slices.ContainsFunc(a.stopwords, func(w string) bool { return strings.Contains(lower, w) })
	if !a.and {
		return regex || stop
	}
	if a.paths {
		return false // a path condition fails for text without a path
	}
	ok := len(a.regexes) > 0 || len(a.stopwords) > 0
	if len(a.regexes) > 0 {
		ok = ok && regex
	}
	if len(a.stopwords) > 0 {
		ok = ok && stop
	}
	return ok
}

func lineAround(text string, start, end int) string {
	ls := strings.LastIndexByte(text[:start], '\n') + 1
	le := strings.IndexByte(text[end:], '\n')
	if le < 0 {
		return text[ls:]
	}
	return text[ls : end+le]
}

// Entropy is the Shannon entropy of s in bits per byte.
func Entropy(s string) float64 {
	if s == "" {
		return 0
	}
	var counts [256]int
	for i := 0; i < len(s); i++ {
		counts[s[i]]++
	}
	var h float64
	n := float64(len(s))
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h
}

// Redact replaces every finding's secret in text with a marker naming
// its rule. fs must come from scanning text.
func Redact(text string, fs []Finding) string {
	if len(fs) == 0 {
		return text
	}
	var b strings.Builder
	at := 0
	for _, f := range fs {
		if f.Start < at {
			if f.End > at { // overlapping: extend the redaction
				at = f.End
			}
			continue
		}
		b.WriteString(text[at:f.Start])
		b.WriteString("[REDACTED:" + f.Rule + "]")
		at = f.End
	}
	b.WriteString(text[at:])
	return b.String()
}
