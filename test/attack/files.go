package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Attacks on the filesystem: reads, writes, mounts, devices, the disk cap.

// readHost: ARGS are host paths that must not be visible.
func readHost(args []string) {
	for _, p := range args {
		_, err := os.ReadFile(p)
		expectErr("read "+p, err)
	}
}

// writeOutside: nothing outside the writable places can be written.
func writeOutside(_ []string) {
	for _, p := range []string{"/usr/airlock-pwned", "/etc/airlock-pwned", "/airlock-pwned", "/bin/sh", "/usr/local/bin/airlock", "/usr/bin/env", "/proc/sys/kernel/hostname", "/sys/kernel/airlock", "/dev/airlock-pwned", "/var/lib/dpkg/status"} {
		err := os.WriteFile(p, []byte("x"), 0o644)
		expectErr("write "+p, err)
	}
}

// landlock: a file the mounts leave writable, refused by Landlock alone.
func landlock(_ []string) {
	err := os.WriteFile("/proc/self/comm", []byte("pwned"), 0)
	expectErr("write /proc/self/comm", err)
}

// exe: neither init's binary nor this one can be opened for writing.
func exe(_ []string) {
	for _, p := range []string{"/proc/1/exe", "/proc/self/exe"} {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if f != nil {
			f.Close()
		}
		expectErr("open "+p+" for writing", err)
	}
}

// fds: nothing but stdio is inherited, and the cwd is /workspace.
func fds(_ []string) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		vulnerable("cannot list fds: %v", err)
		return
	}
	var extra []string
	for _, e := range ents {
		n, _ := strconv.Atoi(e.Name())
		if n > 2 {
			// os.ReadDir's own descriptor is closed by now: a
			// descriptor that still resolves was inherited.
			if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
				extra = append(extra, e.Name()+"->"+target)
			}
		}
	}
	if len(extra) > 0 {
		vulnerable("inherited descriptors %v", extra)
	} else {
		blocked("only stdin, stdout, stderr are open")
	}
	wd, _ := os.Getwd()
	if wd != "/workspace" {
		vulnerable("cwd is %q", wd)
	}
}

// mount: no mount can be made or undone.
func mount(_ []string) {
	expectErr("mount tmpfs", unix.Mount("tmpfs", "/tmp", "tmpfs", 0, ""))
	expectErr("mount proc", unix.Mount("proc", "/tmp", "proc", 0, ""))
	expectErr("umount /proc", unix.Unmount("/proc", unix.MNT_DETACH))
	expectErr("bind mount /", unix.Mount("/", "/tmp", "", unix.MS_BIND, ""))
}

// mknod: no device node can be made.
func mknod(_ []string) {
	expectErr("mknod char 1:1 (/dev/mem)", unix.Mknod("/tmp/mem", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))))
	expectErr("mknod block 8:0", unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
}

// stat PATH...: prints each path's owner and mode.
func stat(args []string) {
	for _, p := range args {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			fmt.Printf("%s: %v\n", p, err)
			continue
		}
		fmt.Printf("%s %d:%d %o\n", p, st.Uid, st.Gid, st.Mode&0o7777)
	}
}

// fill PATH: writes until the disk cap answers ENOSPC.
func fill(args []string) {
	f, err := os.Create(args[0])
	if err != nil {
		vulnerable("create: %v", err)
		return
	}
	buf := make([]byte, 1<<20)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				blocked("ENOSPC after %d MiB", n>>20)
			} else {
				vulnerable("write failed with %v after %d MiB", err, n>>20)
			}
			break
		}
	}
}
