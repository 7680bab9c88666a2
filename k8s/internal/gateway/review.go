package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// access is one question the gateway asks the apiserver: may this caller
// do verb on agents.x-k8s.io sandboxes/subresource (name) in namespace?
type access struct {
	Verb        string
	Namespace   string
	Subresource string
	Name        string
}

// reviewer answers who a bearer token is (TokenReview) and what it may do
// (SubjectAccessReview), remembering each answer, yes or no, for ttl so
// that a stream of execs costs the apiserver two calls every ttl, not two
// per call.
type reviewer struct {
	kube   kubernetes.Interface
	ttl    time.Duration
	now    func() time.Time
	users  *ttlCache[*authnv1.UserInfo] // token hash → user (nil: not authenticated)
	grants *ttlCache[bool]              // token hash + access → allowed
}

func newReviewer(kube kubernetes.Interface, ttl time.Duration, max int, now func() time.Time) *reviewer {
	return &reviewer{
		kube:   kube,
		ttl:    ttl,
		now:    now,
		users:  newTTLCache[*authnv1.UserInfo](max),
		grants: newTTLCache[bool](max),
	}
}

// tokenKey is what the caches hold in place of a token: never the token.
func tokenKey(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// authenticate returns the token's user, or nil when the apiserver does
// not know the token.
func (r *reviewer) authenticate(ctx context.Context, tk, token string) (*authnv1.UserInfo, error) {
	if u, ok := r.users.get(tk, r.now()); ok {
		return u, nil
	}
	res, err := r.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("tokenreview: %w", err)
	}
	var u *authnv1.UserInfo
	if res.Status.Authenticated && res.Status.Error == "" {
		u = &res.Status.User
	}
	r.users.put(tk, u, r.now(), r.ttl)
	return u, nil
}

// authorize asks whether u may have a.
func (r *reviewer) authorize(ctx context.Context, tk string, u *authnv1.UserInfo, a access) (bool, error) {
	key := tk + "\x00" + a.Verb + "\x00" + a.Namespace + "\x00" + a.Subresource + "\x00" + a.Name
	if ok, hit := r.grants.get(key, r.now()); hit {
		return ok, nil
	}
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	res, err := r.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{
			User:   u.Username,
			UID:    u.UID,
			Groups: u.Groups,
			Extra:  extra,
			ResourceAttributes: &authzv1.ResourceAttributes{
				Namespace:   a.Namespace,
				Verb:        a.Verb,
				Group:       sandboxGroup,
				Resource:    "sandboxes",
				Subresource: a.Subresource,
				Name:        a.Name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subjectaccessreview: %w", err)
	}
	ok := res.Status.Allowed && !res.Status.Denied
	r.grants.put(key, ok, r.now(), r.ttl)
	return ok, nil
}

// ttlCache is a map whose entries expire, holding at most max of them:
// when full, the expired go first, then arbitrary ones (the cache only
// saves apiserver calls; losing an entry costs one call).
type ttlCache[V any] struct {
	mu  sync.Mutex
	max int
	m   map[string]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v   V
	exp time.Time
}

func newTTLCache[V any](max int) *ttlCache[V] {
	return &ttlCache[V]{max: max, m: map[string]ttlEntry[V]{}}
}

func (c *ttlCache[V]) get(k string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !now.Before(e.exp) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *ttlCache[V]) put(k string, v V, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for key, e := range c.m {
			if !now.Before(e.exp) {
				delete(c.m, key)
			}
		}
		for key := range c.m {
			if len(c.m) < c.max {
				break
			}
			delete(c.m, key)
		}
	}
	c.m[k] = ttlEntry[V]{v, now.Add(ttl)}
}
