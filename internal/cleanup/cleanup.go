// Package cleanup is the one pattern for undoing a multi-step set-up that
// fails half-way: each step that takes something pushes what gives it back;
// on failure the caller runs them, newest first; on success it takes them
// over (Release) and owns them from then on.
//
//	var undo cleanup.Stack
//	defer undo.RunUnless(&err)
//	f, err := open(); if err != nil { return err }
//	undo.Push(f.Close)
package cleanup

import "errors"

// Stack holds undo steps, run newest first. The zero value is ready.
type Stack struct {
	steps []func() error
}

// Push adds a step that gives back what the last set-up step took.
func (s *Stack) Push(step func() error) { s.steps = append(s.steps, step) }

// Do adds a step that cannot fail.
func (s *Stack) Do(step func()) {
	s.Push(func() error { step(); return nil })
}

// Run undoes every step, newest first, and joins their errors. The stack is
// empty afterwards.
func (s *Stack) Run() error {
	var errs []error
	for i := len(s.steps) - 1; i >= 0; i-- {
		if err := s.steps[i](); err != nil {
			errs = append(errs, err)
		}
	}
	s.steps = nil
	return errors.Join(errs...)
}

// RunUnless runs the stack when *err is set (for a defer in a function with
// a named error result); its own errors are joined to *err.
func (s *Stack) RunUnless(err *error) {
	if *err != nil {
		if uerr := s.Run(); uerr != nil {
			*err = errors.Join(*err, uerr)
		}
	}
}

// Release hands the steps to the caller as one function (which runs them,
// newest first, once) and empties the stack: the set-up succeeded, and
// whoever holds the result gives its parts back later.
func (s *Stack) Release() func() error {
	steps := s.steps
	s.steps = nil
	done := false
	return func() error {
		if done {
			return nil
		}
		done = true
		rest := Stack{steps: steps}
		return rest.Run()
	}
}
