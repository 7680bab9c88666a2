package main

// int80 makes an i386-ABI system call (implemented in assembly) and
// returns its result.
func int80() int64
