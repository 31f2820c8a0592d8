package expiry

import (
	"fmt"
	"testing"
)

// TestTimers: timers fire in time order, a uid set again moves its one
// timer, due means before now (a key expires once its time is past), the
// limit leaves the rest for the next slot, and keepOnly drops the rest.
func TestTimers(t *testing.T) {
	var tm timers
	tm.set("c", 30, false)
	tm.set("a", 10, false)
	tm.set("b", 20, true)
	tm.set("d", 40, false)
	tm.set("a", 25, false) // renewed: moved later
	if at, ok := tm.next(); !ok || at != 20 {
		t.Fatalf("next = %d %v, want 20", at, ok)
	}
	if got := tm.popDue(20, 10); len(got) != 0 {
		t.Fatalf("popDue(20) = %v, want none: a timer at 20 fires once 20 is past", got)
	}
	got := tm.popDue(31, 2)
	if len(got) != 2 || got[0].uid != "b" || !got[0].held || got[1].uid != "a" {
		t.Fatalf("popDue(31, 2) = %+v, want b (held), a", got)
	}
	if got := tm.popDue(31, 2); len(got) != 1 || got[0].uid != "c" {
		t.Fatalf("next slot = %+v, want c", got)
	}
	for i := range 100 {
		tm.set(fmt.Sprint("x", i), int64(1000-i), false)
	}
	tm.keepOnly(func(uid string) bool { return uid == "d" || uid == "x7" || uid == "x99" })
	if tm.len() != 3 || len(tm.by) != 3 {
		t.Fatalf("after keepOnly: %d timers, %d by uid; want 3", tm.len(), len(tm.by))
	}
	var order []string
	for _, x := range tm.popDue(1<<40, 10) {
		order = append(order, x.uid)
	}
	if fmt.Sprint(order) != "[d x99 x7]" {
		t.Fatalf("after keepOnly, fired %v, want [d x99 x7]", order)
	}
}
