package cleanup

import (
	"errors"
	"slices"
	"testing"
)

func TestRunsNewestFirstOnlyOnError(t *testing.T) {
	var got []int
	setup := func(fail bool) (err error) {
		var undo Stack
		defer undo.RunUnless(&err)
		for i := 1; i <= 3; i++ {
			undo.Do(func() { got = append(got, i) })
		}
		if fail {
			return errors.New("step 4")
		}
		return nil
	}
	if err := setup(false); err != nil || len(got) != 0 {
		t.Fatalf("success ran the undo steps: %v %v", err, got)
	}
	if err := setup(true); err == nil || !slices.Equal(got, []int{3, 2, 1}) {
		t.Fatalf("failure: err %v, undo order %v, want [3 2 1]", err, got)
	}
}

func TestUndoErrorsAreJoined(t *testing.T) {
	first, undoErr := errors.New("set-up"), errors.New("undo")
	err := func() (err error) {
		var undo Stack
		defer undo.RunUnless(&err)
		undo.Push(func() error { return undoErr })
		return first
	}()
	if !errors.Is(err, first) || !errors.Is(err, undoErr) {
		t.Fatalf("err %v: want both the set-up's and the undo's error", err)
	}
}

func TestReleaseHandsOverOnce(t *testing.T) {
	var undo Stack
	n := 0
	undo.Do(func() { n++ })
	give := undo.Release()
	if err := undo.Run(); err != nil || n != 0 {
		t.Fatalf("the released stack still ran its steps (n=%d)", n)
	}
	_ = give()
	_ = give()
	if n != 1 {
		t.Fatalf("the handed-over steps ran %d times, want once", n)
	}
}
