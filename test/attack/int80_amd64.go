package main

// int80 makes an i386-ABI system call (implemented in assembly).
func int80()
