package image

import (
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/airlock-sandbox/airlock/internal/editdist"
)

// A reference that is not found may be a typo: suggest gives the nearest
// well-known form of it (an official image, a tag variant, a public
// registry), or, for the host's own user, an image of the cache. The
// cache is shared by every tenant, so a tenant is never told what it
// holds.

// officialImages are Docker Hub's most pulled official images.
var officialImages = []string{
	"almalinux", "alpine", "amazonlinux", "archlinux", "bash", "busybox", "buildpack-deps",
	"centos", "clojure", "debian", "docker", "eclipse-temurin", "elixir", "erlang", "fedora",
	"gcc", "golang", "gradle", "haskell", "hello-world", "httpd", "julia", "mariadb", "maven",
	"memcached", "mongo", "mysql", "nginx", "node", "openjdk", "oraclelinux", "perl", "php",
	"postgres", "pypy", "python", "rabbitmq", "redis", "rockylinux", "ruby", "rust", "swift",
	"ubuntu",
}

// tagWords are the words of official images' tags (python:3.12-slim,
// node:22-bookworm, golang:1.23-alpine).
var tagWords = []string{
	"alpine", "bookworm", "bullseye", "buster", "trixie", "slim", "jammy", "noble", "focal",
	"latest", "lts", "windowsservercore", "nanoserver",
}

// registries are well-known public registries.
var registries = []string{"docker.io", "ghcr.io", "quay.io", "gcr.io", "registry.k8s.io", "public.ecr.aws", "mcr.microsoft.com", "registry.gitlab.com"}

// suggest returns " (did you mean X?)" for a near miss of ref, or "".
func (s *Store) suggest(ref string, r name.Reference) string {
	if !s.Tenants {
		if all, err := s.List(); err == nil {
			best, bestD := "", 3
			for _, m := range all {
				for _, n := range m.Names {
					if d := editdist.Distance(n, ref); d > 0 && d < bestD && d <= len(ref)/4 {
						best, bestD = n, d
					}
				}
			}
			if best != "" {
				return " (did you mean " + best + ", which is in the image cache?)"
			}
		}
	}
	if fixed := nearForm(ref, r); fixed != "" && fixed != ref {
		return " (did you mean " + fixed + "?)"
	}
	return ""
}

// nearForm is ref with each part that is a near miss of a well-known one
// corrected: the registry, an official image's name, a tag's words.
func nearForm(ref string, r name.Reference) string {
	rest, tagOrDigest := ref, ""
	if i := strings.LastIndexAny(ref, ":@"); i > strings.LastIndex(ref, "/") {
		rest, tagOrDigest = ref[:i], ref[i:]
	}
	parts := strings.Split(rest, "/")
	if len(parts) > 1 && strings.ContainsAny(parts[0], ".:") {
		parts[0] = nearest(parts[0], registries)
	}
	if r.Context().RegistryStr() == name.DefaultRegistry {
		last := len(parts) - 1
		if len(parts) == 1 || len(parts) == 2 && parts[0] == "library" || len(parts) == 3 && parts[1] == "library" {
			parts[last] = nearest(parts[last], officialImages)
		}
	}
	if strings.HasPrefix(tagOrDigest, ":") {
		words := strings.Split(tagOrDigest[1:], "-")
		for i, w := range words {
			words[i] = nearest(w, tagWords)
		}
		tagOrDigest = ":" + strings.Join(words, "-")
	}
	return strings.Join(parts, "/") + tagOrDigest
}

// nearest is the one of known that w is a near miss of, or w: an exact
// match, or nothing within reach (one edit for a short word, two else).
func nearest(w string, known []string) string {
	if len(w) < 3 {
		return w
	}
	best, bestD := w, 2
	if len(w) >= 6 {
		bestD = 3
	}
	for _, k := range known {
		d := editdist.Distance(w, k)
		if d == 0 {
			return w
		}
		if d < bestD {
			best, bestD = k, d
		}
	}
	return best
}
