package session

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// TestAttackTimelineStampBounds appends, through AppendTimeline, entries
// whose Ago is at the edges of what Go can send, and checks each stored
// stamp is exactly Redis's now less Ago (read raw, as stored), and that
// the timeline's expiry is the keep sent.
func TestAttackTimelineStampBounds(t *testing.T) {
	s, ctx := newStore(t)
	now := redisNow(t, s.rdb).UnixMilli()
	agos := []time.Duration{
		0, time.Millisecond, 1500 * time.Microsecond, -time.Hour, 24 * time.Hour,
		time.Duration(now-1) * time.Millisecond, // stamp 1 ms past the epoch
		time.Duration(now+5000) * time.Millisecond,
		time.Duration(math.MaxInt64),
	}
	for _, keep := range []time.Duration{time.Hour, 1500 * time.Millisecond * 1000, time.Duration(math.MaxInt64)} {
		for i, ago := range agos {
			uid := fmt.Sprintf("u-%v-%d", keep, i)
			before := redisNow(t, s.rdb).UnixMilli()
			ok, err := s.AppendTimeline(ctx, []TimelineRecord{{UID: uid, Entry: `{"kind":"x"}`, Ago: ago}}, TimelineBounds{Entries: 5, Keep: keep})
			if err != nil || !ok[0] {
				t.Fatalf("ago %v keep %v: %v %v", ago, keep, ok, err)
			}
			after := redisNow(t, s.rdb).UnixMilli()
			raw, err := s.rdb.LRange(ctx, s.ks.TimelineKey(uid), 0, -1).Result()
			if err != nil || len(raw) != 1 {
				t.Fatalf("ago %v: %v %v", ago, raw, err)
			}
			stamp, _, _ := strings.Cut(raw[0], " ")
			a := max(0, ago.Milliseconds())
			var got int64
			if _, err := fmt.Sscanf(stamp, "%d", &got); err != nil || fmt.Sprint(got) != stamp || got < before-a || got > after-a {
				t.Errorf("ago %v: stored stamp %q, want an integer in [%d, %d]", ago, stamp, before-a, after-a)
			}
			pttl, err := s.rdb.PTTL(ctx, s.ks.TimelineKey(uid)).Result()
			if err != nil || pttl <= 0 || pttl > keep.Truncate(time.Millisecond) || pttl < keep.Truncate(time.Millisecond)-5*time.Second {
				t.Errorf("ago %v keep %v: PTTL %v, %v", ago, keep, pttl, err)
			}
			_, entries, err := s.Timeline(ctx, uid)
			if err != nil || len(entries) != 1 {
				t.Fatalf("read: %v %v", entries, err)
			}
			if want := got > 0; (entries[0].Err == nil) != want {
				t.Errorf("ago %v: stamp %q read as %+v", ago, stamp, entries[0])
			}
		}
	}
}

// TestAttackTimelineRawArgs calls the script with ARGV a caller other
// than AppendTimeline might send (an older Go sent the same integers):
// the keep as a decimal string, and the age as one.
func TestAttackTimelineRawArgs(t *testing.T) {
	s, ctx := newStore(t)
	for i, tc := range []struct {
		keep, ago string
	}{
		{"86400000", "0"}, {"1", "0"}, {"9223372036854", "9223372036854"}, {"86400000", "12"},
	} {
		key := s.ks.TimelineKey(fmt.Sprintf("raw%d", i))
		sc, keys, args := timelineAddScript.call(timelineAddKeys{Entries: []string{key}}, "10", tc.keep, tc.ago, "e")
		if err := sc.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
			t.Errorf("keep %s ago %s: %v", tc.keep, tc.ago, err)
		}
	}
}
