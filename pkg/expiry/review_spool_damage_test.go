package expiry

// Review of the listener with a spool that goes past damage and cannot
// always save its read position.
//
// Run: go test -race -count=1 -run 'TestReviewSpool' ./pkg/expiry/

import (
	"encoding/binary"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/spool"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestReviewSpoolDamageWithUnsavablePositionPausesListener: the case the
// change fixed in TestAttackSpoolUnsavableCursorPausesListener ("pos": a
// read position that can be neither written nor removed, so the drained
// file is not cut and stays Full) comes back as soon as one spooled event
// is damaged on disk while the listener runs. The spool counts the
// damaged frame as pending until reset, and reset fails here, so after
// the replay has produced every intact event Len() stays 1: pausedBySpool
// (Full() && Len() > 0) pauses every sweep for good, direct() is false for
// good, and the replay loop peeks nothing and goes round without waiting.
// The silences the full spool left in the index, and every later one,
// never get their guide.
//
// The busy replay loop has a second effect: it never looks at its
// context (Len() > 0, Peek returns nothing, produceSpooled of nothing
// returns true at once, Commit of the same head does nothing), so the
// listener cannot be stopped: a shutdown hangs until the process is
// killed.
//
// Failed so: the replay went past the damage and produced every intact
// spooled event (213 of 601 in the run seen), then nothing more reached
// the topic, "after" included; the spool reported Len 1, Full; and the
// listener did not stop within 20s, its replay goroutine spinning. Now
// nothing is pending once Commit reaches the end of the file, whatever
// reset does, and a replay that reads nothing waits.
func TestReviewSpoolDamageWithUnsavablePositionPausesListener(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	cfg.SpoolMaxBytes = 64 << 10 // the least allowed: about 400 events
	l, _ := h.startListener(cfg)
	if err := os.MkdirAll(filepath.Join(cfg.SpoolDir, "spool.pos", "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	fault := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	// One first, so that the replay holds only it in memory while Kafka
	// is down and reads the others from disk once Kafka is back.
	want := map[string]grant{"first": h.renew("first", "default", 100*time.Millisecond)}
	waitFor(t, waitLong, "the first silence spooled", func() bool { return l.spool.Len() >= 1 })
	maps.Copy(want, h.silentOver("user", 600, 200*time.Millisecond, 2*time.Second))
	waitFor(t, waitLong, "the spool to fill", func() bool { return l.spool.Full() })

	// One event near the end of the spool damaged in place.
	data, err := os.ReadFile(filepath.Join(cfg.SpoolDir, "spool.log"))
	if err != nil {
		t.Fatal(err)
	}
	offsets, _ := spool.Scan(data)
	i := len(offsets) - 3
	at := offsets[i]
	ev, err := timeoutevent.Parse(data[at+8 : at+8+int64(binary.BigEndian.Uint32(data[at:]))])
	if err != nil {
		t.Fatal(err)
	}
	damageSpoolFrame(t, cfg.SpoolDir, i)
	delete(want, ev.UID)

	fault.Remove()
	waitFor(t, waitLong, "the replay to go past the damaged event", func() bool { return l.spool.Skipped() > 0 })
	want["after"] = h.renew("after", "default", 200*time.Millisecond)

	ok := eventually(waitLong, func() bool { return h.produced() >= int64(len(want)) })
	got := h.onTopicSet()
	missing := 0
	for uid := range want {
		if !got[uid] {
			missing++
		}
	}
	if !ok || missing > 0 {
		t.Fatalf("one spooled event damaged (record %d of %d), the read position unsavable; Kafka back for %v: "+
			"%d of %d intact silences have no event, the one after the replay among them: %v; the spool says "+
			"Len %d, Size %d of a %d cap, Full %v, Skipped %d: the damaged frame stays pending, so the "+
			"listener pauses its sweeps for good",
			i, len(offsets), waitLong, missing, len(want), !got["after"],
			l.spool.Len(), l.spool.Size(), cfg.SpoolMaxBytes, l.spool.Full(), l.spool.Skipped())
	}
}
