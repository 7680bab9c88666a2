package lifecycle

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

func baseDigest(image, digest string, full bool, unique string) string {
	h := sha256.New()
	snapshotBase(h, image, digest, full, unique)
	return hex.EncodeToString(h.Sum(nil))
}

// A snapshot's files are named by its content digest, and a later
// snapshot of equal digest keeps the files saved first, whoever saved
// them. Regression: the digest took the image by name, so a snapshot of a
// sandbox of registry/app:latest (or oci:/shared/app) with an unchanged
// root layer got the files of an earlier one taken over other content
// under that name — possibly another tenant's, who chose it.
func TestSnapshotDigestCoversTheImagesContent(t *testing.T) {
	if baseDigest("registry.test/app:latest", "sha256:aaaa", true, "t1") == baseDigest("registry.test/app:latest", "sha256:bbbb", true, "t2") {
		t.Error("two contents of one image name give one snapshot digest")
	}
	if baseDigest("registry.test/app:latest", "sha256:aaaa", true, "t1") != baseDigest("registry.test/app:latest", "sha256:aaaa", true, "t2") {
		t.Error("one image's content gives two snapshot digests (no sharing)")
	}
	if baseDigest("/srv/images/app", "", true, "t1") == baseDigest("/srv/images/app", "", true, "t2") {
		t.Error("a directory image (no content digest) gives a shared snapshot digest")
	}
	if baseDigest("host", "", false, "t1") != baseDigest("host", "", false, "t2") {
		t.Error("a workspace-only snapshot is not shared")
	}
}
