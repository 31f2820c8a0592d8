package expiry

import "container/heap"

// timers are the prefetch path's local timers: one per uid, at the time
// (Redis ms) its index entry falls due, or its hold is released (held),
// in a min-heap by that time. Setting a uid again moves its one timer: a
// window read again, a renewal, a stage scheduled after the one produced.
// Not safe for concurrent use: the pipeline goroutine owns them.
type timers struct {
	h  timerHeap
	by map[string]*timer
}

type timer struct {
	uid  string
	at   int64 // Redis ms
	held bool  // a release from the hold set, else a due time in the index
	i    int   // its place in the heap
}

// set arms uid's timer at at, moving the one it had.
func (t *timers) set(uid string, at int64, held bool) {
	if t.by == nil {
		t.by = map[string]*timer{}
	}
	if tm, ok := t.by[uid]; ok {
		tm.at, tm.held = at, held
		heap.Fix(&t.h, tm.i)
		return
	}
	tm := &timer{uid: uid, at: at, held: held}
	t.by[uid] = tm
	heap.Push(&t.h, tm)
}

// next is the earliest timer's time.
func (t *timers) next() (int64, bool) {
	if len(t.h) == 0 {
		return 0, false
	}
	return t.h[0].at, true
}

// popDue removes and returns up to limit timers, earliest first, whose
// time is before now: Redis expires a key only once its time is past, so
// a timer at at fires at at+1 ms.
func (t *timers) popDue(now int64, limit int) []timer {
	var out []timer
	for len(t.h) > 0 && t.h[0].at < now && len(out) < limit {
		tm := heap.Pop(&t.h).(*timer)
		delete(t.by, tm.uid)
		out = append(out, *tm)
	}
	return out
}

// keepOnly drops every timer whose uid keep rejects.
func (t *timers) keepOnly(keep func(uid string) bool) {
	kept := t.h[:0]
	for _, tm := range t.h {
		if keep(tm.uid) {
			tm.i = len(kept)
			kept = append(kept, tm)
		} else {
			delete(t.by, tm.uid)
		}
	}
	clear(t.h[len(kept):])
	t.h = kept
	heap.Init(&t.h)
}

func (t *timers) len() int { return len(t.h) }

type timerHeap []*timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}
func (h *timerHeap) Push(x any) {
	tm := x.(*timer)
	tm.i = len(*h)
	*h = append(*h, tm)
}
func (h *timerHeap) Pop() any {
	old := *h
	tm := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return tm
}
