package rootfs

import (
	"testing"
)

func TestSystemAccounts(t *testing.T) {
	passwd := "root:x:0:0:root:/root:/bin/bash\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\nalice:$6$hash:1000:1000:Alice:/home/alice:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n# comment\n"
	got := systemAccounts(passwd, "base", 2)
	want := "root:x:0:0:root:/root:/bin/bash\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	if got != want {
		t.Fatalf("passwd:\n%s", got)
	}
	group := "root:x:0:\nsudo:x:27:alice\nssl-cert:x:110:postgres\nalice:x:1000:\n"
	if got := systemAccounts(group, "base", 2); got != "root:x:0:\nsudo:x:27:\nssl-cert:x:110:\n" {
		t.Fatalf("group:\n%s", got)
	}
	if got := systemAccounts("", "base", 2); got != "base" {
		t.Fatalf("empty: %q", got)
	}
}
