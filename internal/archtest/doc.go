// Package archtest holds no code: its tests keep the package boundaries of
// docs/architecture.md true (who may import what, and that every package
// says what it owns).
package archtest
