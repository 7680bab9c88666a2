package nodes

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// feed is an unbounded queue of objects, each at most once while queued,
// drained into out (a source.Channel's input) so that the tracker never
// blocks on a slow consumer.
type feed struct {
	mu     sync.Mutex
	queue  []client.Object
	queued map[types.NamespacedName]bool
	kick   chan struct{}
	out    chan event.GenericEvent
}

func newFeed() *feed {
	return &feed{queued: map[types.NamespacedName]bool{}, kick: make(chan struct{}, 1), out: make(chan event.GenericEvent)}
}

func (f *feed) send(obj client.Object) {
	k := client.ObjectKeyFromObject(obj)
	f.mu.Lock()
	if !f.queued[k] {
		f.queued[k] = true
		f.queue = append(f.queue, obj)
	}
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

func (f *feed) run(ctx context.Context) {
	for {
		f.mu.Lock()
		var obj client.Object
		if len(f.queue) > 0 {
			obj = f.queue[0]
			f.queue[0] = nil
			f.queue = f.queue[1:]
			delete(f.queued, client.ObjectKeyFromObject(obj))
		}
		f.mu.Unlock()
		if obj == nil {
			select {
			case <-ctx.Done():
				return
			case <-f.kick:
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case f.out <- event.GenericEvent{Object: obj}:
		}
	}
}
