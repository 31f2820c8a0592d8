package expiry

// Attacks on the listener's spool and replay path.
//
// The first two failed before the spool went past damage and the
// listener paused only for a spool with something to replay; the other
// two passed from the start, each covering a risk.
//
// Run: go test -race -count=1 -run 'TestAttackSpool' ./pkg/expiry/

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/spool"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// damageSpoolFrame flips one byte of the payload of the i-th record in
// the spool file of dir, in place, as a bad sector or a bit flip would,
// while the listener has the spool open.
func damageSpoolFrame(t *testing.T, dir string, i int) {
	t.Helper()
	path := filepath.Join(dir, "spool.log")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	offsets, _ := spool.Scan(data)
	if i >= len(offsets) {
		t.Fatalf("the spool holds %d records, no record %d", len(offsets), i)
	}
	at := offsets[i] + 8 // past the frame's length and checksum
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{data[at] ^ 0x40}, at); err != nil {
		t.Fatal(err)
	}
}

// onTopicSet is the set of uids with an event on the topic.
func (h *harness) onTopicSet() map[string]bool {
	h.t.Helper()
	got := map[string]bool{}
	for _, ev := range h.events() {
		got[ev.UID] = true
	}
	return got
}

// TestAttackSpoolDamagedFrameBlackHolesLaterTimeouts: one spooled event
// damaged on disk (a flipped bit, an unreadable sector) while the
// listener runs stops the replay at it for good: Peek fails there every
// time, the replay logs and retries forever, the spool never drains, so
// the listener never produces directly again. Every event spooled after
// the damaged one stays unproduced, and so does every timeout found from
// then on, Kafka up or not: each is spooled behind the damage, its dedup
// key marked spooled and its next stage left waiting for a replay that
// never comes. A restart does not help: recovery cuts the file at the
// damaged record and keeps all after it aside (see the spool package's
// TestAttackSpoolDamagedFrameLosesLaterRecords).
//
// Failed when the spool stopped at damage: no event from the start of the
// replay's chunk that held the damaged one reached the topic (199 of 700
// in the runs seen), nor the timeout of a user silent after Kafka came
// back. Now the spool goes past the damaged frame to the next intact one,
// and the replay counts and logs the damaged bytes
// (stillthere_listener_spool_damaged_bytes_total) and goes on.
func TestAttackSpoolDamagedFrameBlackHolesLaterTimeouts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	l, _ := h.startListener(cfg)
	fault := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	// More than the replay's chunk of 500, so that the damaged record is
	// beyond the chunk the replay holds in memory while Kafka is down:
	// it reads the damaged one from disk once Kafka is back.
	const n, damaged = 700, 550
	spooled := h.silentOver("spooled", n, 200*time.Millisecond, time.Second)
	waitFor(t, waitLong, "every silence spooled", func() bool { return l.spool.Len() >= n })
	damageSpoolFrame(t, cfg.SpoolDir, damaged)
	fault.Remove()

	h.renew("after", "default", 200*time.Millisecond)
	// Everything but the damaged event should reach the topic: the
	// undamaged spooled ones, and the silence that began with Kafka up.
	ok := eventually(waitLong, func() bool { return h.produced() >= n })
	got := h.onTopicSet()
	missing := 0
	for uid := range spooled {
		if !got[uid] {
			missing++
		}
	}
	if !ok || !got["after"] || missing > 1 {
		t.Fatalf("DEFECT: one spooled event damaged on disk (record %d of %d); Kafka back for %v: "+
			"%d of the %d spooled silences have no event (want at most the damaged one), the silence of a user "+
			"gone quiet after Kafka came back has one: %v; the spool still holds %d events: "+
			"the replay stops at the damaged record for good and every later timeout is spooled behind it",
			damaged, n, waitLong, missing, n, got["after"], l.spool.Len())
	}
}

// TestAttackSpoolUnsavableCursorPausesListener: when the spool cannot
// save its read position (the directory takes no new file: its inodes
// exhausted, or its permissions changed under the process), a drained
// spool used never to be truncated, and Full() went on counting the
// committed bytes. Once a Kafka outage filled it, the listener paused
// every sweep and the prefetch path for good, with Kafka back and the
// spool empty: the silences the full spool left in the index were never
// produced, nor any later one (with no other replica, no guide ever went
// out again).
//
// Failed so: the silences left in the index when the spool filled, and a
// new one after the replay, got no event. Two ways to block the position,
// each fixed its own way: "tmp" (a directory where the position's
// temporary file goes) leaves the saved position removable, which the
// spool now does instead, so the drained file is cut; "pos" (the position
// itself a directory with a file in it) can be neither written nor
// removed, so the file stays whole and Full, and the listener no longer
// pauses for a spool with nothing to replay.
func TestAttackSpoolUnsavableCursorPausesListener(t *testing.T) {
	t.Parallel()
	for _, block := range []string{"tmp", "pos"} {
		t.Run(block, func(t *testing.T) {
			t.Parallel()
			unsavableCursorPausesListener(t, block)
		})
	}
}

func unsavableCursorPausesListener(t *testing.T, block string) {
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	cfg.SpoolMaxBytes = 64 << 10 // the least allowed: about 400 events
	l, _ := h.startListener(cfg)
	blocker := filepath.Join(cfg.SpoolDir, "spool.pos.tmp")
	if block == "pos" {
		blocker = filepath.Join(cfg.SpoolDir, "spool.pos", "keep")
	}
	if err := os.MkdirAll(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	fault := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	// One first, so that the listener spools from then on without trying
	// Kafka: the batch that waits out a produce timeout would be larger
	// than the whole spool, never fit, and the spool never fill.
	want := map[string]grant{"first": h.renew("first", "default", 100*time.Millisecond)}
	waitFor(t, waitLong, "the first silence spooled", func() bool { return l.spool.Len() >= 1 })
	maps.Copy(want, h.silentOver("user", 600, 200*time.Millisecond, 2*time.Second))
	waitFor(t, waitLong, "the spool to fill", func() bool { return l.spool.Full() })
	fault.Remove()
	waitFor(t, waitLong, "the spool to be replayed", func() bool { return l.spool.Len() == 0 })
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
		t.Fatalf("DEFECT: Kafka back and the spool replayed (Len %d) but not cut (Size %d of a %d cap, Full %v): "+
			"%d of %d silences have no event after %v, the one after the replay among them: %v; "+
			"the listener pauses its sweeps for a full spool with nothing in it",
			l.spool.Len(), l.spool.Size(), cfg.SpoolMaxBytes, l.spool.Full(), missing, len(want), waitLong, !got["after"])
	}
}

// TestAttackSpoolReplayPartlyProducedThenStopped: Kafka comes back for
// some partitions only while the spool replays: the chunk is produced in
// part, and the listener is stopped (as a crash would) before the rest
// goes. The chunk must not be committed, so that the restart replays it:
// what did not go out goes then, what did goes again with the same ids
// (which the consumer collapses), and nothing is lost or given a new id.
//
// PASSES: produceSpooled commits a chunk only once every event of it is
// produced, and re-sends only the failed ones.
func TestAttackSpoolReplayPartlyProducedThenStopped(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	l, stop := h.startListener(cfg)
	outage := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	const n = 40
	want := h.silentOver("u", n, 200*time.Millisecond, 500*time.Millisecond)
	waitFor(t, waitLong, "every silence spooled", func() bool { return l.spool.Len() >= n })

	// A restart in the outage: the new replay reads the whole spool as
	// one chunk. Partition 0 stays down; the others come back.
	stop()
	part := kgo.StickyKeyPartitioner(nil).ForTopic(testTopic)
	onP0 := map[string]bool{}
	for uid := range want {
		if part.Partition(&kgo.Record{Key: []byte(uid)}, cfg.Kafka.Partitions) == 0 {
			onP0[uid] = true
		}
	}
	if len(onP0) == 0 || len(onP0) == n {
		t.Fatalf("%d of %d uids on partition 0: pick other uids", len(onP0), n)
	}
	p0 := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Partitions: []int32{0}, Err: kerr.NotEnoughReplicas, Count: -1})
	outage.Remove()
	l, stop = h.startListener(cfg)
	waitFor(t, waitLong, "the replay to produce the events of the partitions that are back", func() bool {
		return h.produced() >= int64(n-len(onP0))
	})
	stop() // before partition 0 comes back: the chunk is unfinished
	if got := h.produced(); got != int64(n-len(onP0)) {
		t.Fatalf("%d events on the topic with partition 0 refusing, want %d", got, n-len(onP0))
	}
	// Every event not on the topic must still be in the spool: the
	// unfinished chunk is not committed.
	sp, err := spool.Open(cfg.SpoolDir, int64(cfg.SpoolMaxBytes))
	if err != nil {
		t.Fatal(err)
	}
	values, _, err := sp.Peek(10 * n)
	sp.Close()
	if err != nil {
		t.Fatal(err)
	}
	inSpool := map[string]bool{}
	for _, v := range values {
		ev, err := timeoutevent.Parse(v)
		if err != nil {
			t.Fatal(err)
		}
		inSpool[ev.UID] = true
	}
	onTopic := h.onTopicSet()
	for uid := range want {
		if !onTopic[uid] && !inSpool[uid] {
			t.Errorf("%s (partition 0: %v): neither on the topic nor in the spool after a stop in the middle of the replay", uid, onP0[uid])
		}
	}
	t.Logf("stopped with %d events on the topic and %d in the spool; %d uids on partition 0, which refuses", len(onTopic), len(inSpool), len(onP0))
	if t.Failed() {
		t.FailNow()
	}

	p0.Remove()
	l, stop = h.startListener(cfg)
	defer stop()
	waitFor(t, waitLong, "every silence on the topic", func() bool { return len(h.onTopicSet()) >= n })
	waitFor(t, waitLong, "the spool to be replayed", func() bool { return l.spool.Len() == 0 })
	byID := map[string]map[string]bool{}
	for _, ev := range h.events() {
		if byID[ev.UID] == nil {
			byID[ev.UID] = map[string]bool{}
		}
		byID[ev.UID][ev.ID] = true
	}
	for uid, g := range want {
		ids := byID[uid]
		if len(ids) != 1 || !ids[timeoutevent.ID(uid, g.deadline.UnixMilli())] {
			t.Errorf("%s (partition 0: %v): event ids %v, want its one id %s", uid, onP0[uid], ids, timeoutevent.ID(uid, g.deadline.UnixMilli()))
		}
	}
	if len(byID) != n {
		t.Errorf("events for %d uids, want %d", len(byID), n)
	}
}

// TestAttackSpoolBatchLargerThanSpoolKeepsDeadlines: in a Kafka outage
// the first batch waits out a produce timeout, and the timeouts found
// meanwhile make the next sweep's batch larger than the whole spool (the
// least cap allowed, 64 KiB, about 400 events): Append refuses it whole
// with ErrFull, every sweep again. None of those timeouts may be lost:
// each stays in the deadline index, its claim released, and is produced
// once Kafka is back, once.
//
// PASSES: the refused batch is judged unsent and left in the index. (The
// spool takes none of it, not even what would fit, and the listener logs
// "spool is full" and "spool has room again" at every sweep meanwhile:
// no loss, but the spool is of no use in such an outage.)
func TestAttackSpoolBatchLargerThanSpoolKeepsDeadlines(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config(ModeSweep)
	cfg.SpoolMaxBytes = 64 << 10
	l, stop := h.startListener(cfg)
	fault := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	want := h.silentOver("user", 600, 200*time.Millisecond, time.Second)
	h.untilRedis(lastDeadline(want))
	// Past every deadline, and a sweep after it, with Kafka down.
	h.sweptPast(h.redisNow())
	inIndex := 0
	for uid := range want {
		if h.inIndex(uid) {
			inIndex++
		}
	}
	t.Logf("with Kafka down: %d spooled, %d in the index", l.spool.Len(), inIndex)
	if l.spool.Len()+inIndex != len(want) {
		t.Fatalf("with Kafka down: %d spooled and %d in the index, want %d in all", l.spool.Len(), inIndex, len(want))
	}
	fault.Remove()
	h.waitProduced(len(want))
	h.waitSettled(slices.Collect(maps.Keys(want)))
	stop()
	checkExactlyOnce(t, h.events(), want, sourcesOf(ModeSweep)...)
}
