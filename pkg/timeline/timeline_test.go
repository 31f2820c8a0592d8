package timeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/redisserver/redistest"
	"github.com/stillthere/stillthere/pkg/session"
)

func newStore(t *testing.T) (*session.Store, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redistest.Client(t, srv)
	ks, err := session.NewKeyspace(redistest.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	return session.NewStore(rdb, ks), rdb
}

// record runs a Recorder over entries and stops it, which sends them all.
func recordAll(t *testing.T, store *session.Store, b session.TimelineBounds, recs ...record) {
	t.Helper()
	r := NewRecorder(store, Config{Service: "listener", Instance: "l-1", Bounds: b})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	for _, x := range recs {
		r.Record(x.uid, x.e)
	}
	cancel()
	<-done
}

func TestRecordAndRead(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	recordAll(t, store, session.TimelineBounds{},
		record{uid: "ann", e: Entry{Kind: KindLapse, Deadline: 1000, Stage: 1}},
		record{uid: "bob", e: Entry{Kind: KindLapse}},
		record{uid: "ann", e: Entry{Kind: KindHeld, Rule: "blind", BlindMS: [2]int64{900, 1100}, Until: 11100}},
		record{uid: "ann", e: Entry{Kind: KindProduced, Event: "e-1", Stage: 1}},
	)
	got, err := Read(ctx, store, "ann", 0)
	if err != nil {
		t.Fatal(err)
	}
	kinds := make([]Kind, len(got))
	for i, e := range got {
		kinds[i] = e.Kind
		if e.Service != "listener" || e.Instance != "l-1" {
			t.Errorf("entry %d recorded by %s/%s, want listener/l-1", i, e.Service, e.Instance)
		}
		if e.At.Before(before) || e.At.After(time.Now().Add(time.Second)) {
			t.Errorf("entry %d at %v: not Redis's now", i, e.At)
		}
	}
	if fmt.Sprint(kinds) != "[lapse held produced]" {
		t.Fatalf("ann's timeline %v, want lapse, held, produced in order", kinds)
	}
	if got[1].Rule != "blind" || got[1].BlindMS != [2]int64{900, 1100} || got[1].Until != 11100 || got[2].Event != "e-1" {
		t.Fatalf("fields lost: %+v", got)
	}
	none, err := Read(ctx, store, "nobody", 0)
	if err != nil || none == nil || len(none) != 0 {
		t.Fatalf("unknown user: %v, %v; want an empty timeline", none, err)
	}
}

// TestFoldedReadsAsTwo: an entry with its finding folded in is one
// stored entry that reads as the two it stands for, the finding first
// at its own time, with the silence and who recorded it; the entries
// metric counts both.
func TestFoldedReadsAsTwo(t *testing.T) {
	store, rdb := newStore(t)
	ctx := context.Background()
	foundAt := time.Now()
	produced := Entry{Kind: KindProduced, Event: "e-1", Detail: "a remind stage", Segment: "s", Stage: 2, Deadline: 1000}
	lapses := testutil.ToFloat64(metricEntries.WithLabelValues("listener", string(KindRechecked), ""))
	recordAll(t, store, session.TimelineBounds{},
		record{uid: "ann", e: Fold(produced, KindRechecked, foundAt, foundAt.Add(250*time.Millisecond))},
		record{uid: "ann", e: Entry{Kind: KindSent}},
	)
	if got := testutil.ToFloat64(metricEntries.WithLabelValues("listener", string(KindRechecked), "")) - lapses; got != 1 {
		t.Errorf("rechecked entries counted %v, want 1", got)
	}
	if n := rdb.LLen(ctx, store.Keyspace().TimelineKey("ann")).Val(); n != 2 {
		t.Fatalf("%d entries stored, want 2", n)
	}
	got, err := Read(ctx, store, "ann", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("read %d entries %+v, want 3: rechecked, produced, sent", len(got), got)
	}
	want := Entry{At: got[1].At.Add(-250 * time.Millisecond), Service: "listener", Instance: "l-1", Kind: KindRechecked, Segment: "s", Stage: 2, Deadline: 1000}
	if got[0] != want {
		t.Errorf("finding read %+v, want %+v", got[0], want)
	}
	produced.At, produced.Service, produced.Instance = got[1].At, "listener", "l-1"
	if got[1] != produced {
		t.Errorf("outcome read %+v, want %+v: nothing of the fold left", got[1], produced)
	}
	if got[2].Kind != KindSent {
		t.Errorf("last entry %+v, want the sent", got[2])
	}
}

// TestOrderAcrossServices: an entry is stamped with when its decision
// was made, not when its service's batch reached Redis, and read in that
// order: a lapse whose listener appends late still reads before the
// guide the consumer sent for it.
func TestOrderAcrossServices(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	listener := NewRecorder(store, Config{Service: "listener"})
	consumer := NewRecorder(store, Config{Service: "consumer"})
	listener.Record("ord", Entry{Kind: KindLapse})
	passRealTime(30 * time.Millisecond)
	consumer.Record("ord", Entry{Kind: KindSent, Rule: "delivered"})
	run := func(r *Recorder) {
		rctx, cancel := context.WithCancel(ctx)
		cancel() // Run sends what is queued, then returns
		r.Run(rctx)
	}
	run(consumer) // the later decision reaches Redis first
	run(listener)
	got, err := Read(ctx, store, "ord", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Kind != KindLapse || got[1].Kind != KindSent || !got[0].At.Before(got[1].At) {
		t.Fatalf("read %+v, want the lapse before the guide sent for it", got)
	}
}

// TestBounds: a timeline keeps its last Entries, and the key goes Keep
// after the last entry.
func TestBounds(t *testing.T) {
	store, rdb := newStore(t)
	ctx := context.Background()
	var recs []record
	for i := range 25 {
		recs = append(recs, record{uid: "cat", e: Entry{Kind: KindSent, Conns: i + 1}})
	}
	recordAll(t, store, session.TimelineBounds{Entries: 10, Keep: time.Minute}, recs...)
	got, err := Read(ctx, store, "cat", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 || got[0].Conns != 16 || got[9].Conns != 25 {
		t.Fatalf("kept %d entries (first %+v), want the last 10", len(got), got[0])
	}
	ks := store.Keyspace()
	ttl, err := rdb.PTTL(ctx, ks.TimelineKey("cat")).Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Fatalf("timeline's TTL %v, %v: want at most the keep of 1m", ttl, err)
	}
}

// TestReadSkipsOld: entries older than keep by Redis's clock are not
// read, though the list still holds them.
func TestReadSkipsOld(t *testing.T) {
	store, rdb := newStore(t)
	ctx := context.Background()
	key := store.Keyspace().TimelineKey("dan")
	old := time.Now().Add(-2 * time.Hour).UnixMilli()
	rdb.RPush(ctx, key, fmt.Sprintf(`%d {"service":"gateway","kind":"start"}`, old), "garbage")
	recordAll(t, store, session.TimelineBounds{}, record{uid: "dan", e: Entry{Kind: KindEnd, Code: 1000}})
	rdb.RPush(ctx, key, fmt.Sprintf(`%d {not json`, time.Now().UnixMilli()))
	got, err := Read(ctx, store, "dan", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The 2h old start is skipped, and so is the entry without a time
	// appended right after it (it counts as old as the entry before it);
	// the one that is not JSON is shown as unreadable, and the rest still
	// read.
	kinds := make([]Kind, len(got))
	for i, e := range got {
		kinds[i] = e.Kind
	}
	if fmt.Sprint(kinds) != "[end unreadable]" {
		t.Fatalf("read %v, want the end and the unreadable one", kinds)
	}
}

// TestRecordNeverBlocks: with Redis gone, Record returns at once and the
// entries are counted as dropped, never waited for.
func TestRecordNeverBlocks(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	ks, _ := session.NewKeyspace(redistest.Prefix(t))
	srv.Close()
	r := NewRecorder(session.NewStore(rdb, ks), Config{Service: "gateway"})
	done := make(chan struct{})
	go func() {
		for i := range 3 * defaultQueue {
			r.Record(fmt.Sprintf("u%d", i), Entry{Kind: KindStart})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a bound on a hang, not a pace
		t.Fatal("Record blocked while Redis was gone")
	}
	var nilRec *Recorder
	nilRec.Record("u", Entry{Kind: KindStart}) // records nothing, does not panic
}

func TestHandler(t *testing.T) {
	store, _ := newStore(t)
	recordAll(t, store, session.TimelineBounds{}, record{uid: "eve", e: Entry{Kind: KindLapse, Stage: 1}})
	const secret = "ops-secret-ops-secret-ops-secret-0123"
	mux := http.NewServeMux()
	mux.Handle(Path, Handler(store, secret, 0))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(uid, token string) (int, Answer) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/v1/users/"+uid+"/timeline", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a Answer
		json.NewDecoder(resp.Body).Decode(&a)
		return resp.StatusCode, a
	}
	for _, c := range []struct {
		name, uid, token string
		code, entries    int
	}{
		{"ok", "eve", secret, 200, 1},
		{"unknown uid: empty", "nobody", secret, 200, 0},
		{"bad uid", "bad%20uid", secret, 400, 0},
		{"no token", "eve", "", 401, 0},
		{"wrong token", "eve", strings.Repeat("x", len(secret)), 401, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, a := get(c.uid, c.token)
			if code != c.code || len(a.Entries) != c.entries {
				t.Fatalf("%d with %d entries, want %d with %d", code, len(a.Entries), c.code, c.entries)
			}
		})
	}
	// The JSON carries each entry's time.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/users/eve/timeline", nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Entries []map[string]any `json:"entries"`
	}
	json.NewDecoder(resp.Body).Decode(&raw)
	resp.Body.Close()
	if len(raw.Entries) != 1 || raw.Entries[0]["at_ms"] == nil || raw.Entries[0]["at"] == nil || raw.Entries[0]["kind"] != "lapse" {
		t.Fatalf("answer %v: want at_ms, at and kind", raw.Entries)
	}
}

func TestDescribe(t *testing.T) {
	ms := func(s string) int64 {
		tm, err := time.Parse("2006-01-02 15:04:05.000", "2026-11-28 "+s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	for _, c := range []struct {
		e    Entry
		want string
	}{
		{Entry{Kind: KindHeld, Rule: "blind", Detail: "Redis restarted", BlindMS: [2]int64{ms("12:02:40.000"), ms("12:02:58.000")}, Until: ms("12:04:13.000")},
			"held: blind (blind interval 12:02:40.000-12:02:58.000, Redis restarted), recheck at 12:04:13.000"},
		{Entry{Kind: KindSent, Rule: "delivered", Conns: 2, Stage: 1, Event: "e-9"}, "sent: delivered (stage 1, 2 connections, event e-9)"},
		{Entry{Kind: KindEnd, Code: 1000}, "end (code 1000)"},
		{Entry{Kind: KindLapse}, "lapse"},
	} {
		if got := Describe(c.e, time.UTC); got != c.want {
			t.Errorf("Describe(%+v)\n got %q\nwant %q", c.e, got, c.want)
		}
	}
	var b bytes.Buffer
	Format(&b, []Entry{{At: time.UnixMilli(ms("12:03:01.200")), Service: "listener", Instance: "l-1", Kind: KindLapse}}, time.UTC)
	if !strings.Contains(b.String(), "12:03:01.200  listener/l-1  lapse") {
		t.Fatalf("table:\n%s", b.String())
	}
}

func TestCheckSecret(t *testing.T) {
	long := strings.Repeat("s", 40)
	for _, c := range []struct {
		secret string
		others []string
		ok     bool
	}{
		{"", nil, true},
		{"short", nil, false},
		{long, []string{"push-" + long}, true},
		{long, []string{long}, false},
	} {
		if err := CheckSecret(c.secret, c.others...); (err == nil) != c.ok {
			t.Errorf("CheckSecret(%q, %q) = %v", c.secret, c.others, err)
		}
	}
}

// TestOrderWithinInstance: an instance's decisions read in the order it
// made them, though its later batch reached Redis sooner than its earlier
// one and so was stamped earlier (a busy run showed a listener's
// "produced" before its "rechecked"); another instance's still reads by
// its stamp.
func TestOrderWithinInstance(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	enc := func(e Entry) string {
		t.Helper()
		s, err := e.encode()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	l1 := func(k Kind) Entry { return Entry{Kind: k, Service: "listener", Instance: "l-1"} }
	bounds := session.TimelineBounds{}.OrDefault()
	// The first batch took 40 ms longer to reach Redis than the second:
	// its entry's age was read 40 ms before it ran.
	if _, err := store.AppendTimeline(ctx, []session.TimelineRecord{{UID: "u", Entry: enc(l1(KindRechecked)), Ago: 0}}, bounds); err != nil {
		t.Fatal(err)
	}
	if _, err := store.AppendTimeline(ctx, []session.TimelineRecord{
		{UID: "u", Entry: enc(l1(KindProduced)), Ago: 40 * time.Millisecond},
		{UID: "u", Entry: enc(Entry{Kind: KindSent, Service: "consumer", Instance: "c-1"}), Ago: 0},
	}, bounds); err != nil {
		t.Fatal(err)
	}
	got, err := Read(ctx, store, "u", 0)
	if err != nil {
		t.Fatal(err)
	}
	if k := Kinds(got); k != "rechecked: produced: sent:" {
		t.Fatalf("read %v, want the listener's own order, rechecked then produced, then the consumer's by its stamp", k)
	}
	if got[1].At != got[0].At {
		t.Errorf("produced at %v, want moved to its predecessor's %v", got[1].At, got[0].At)
	}
}

// lapsed gives uid a 10ms grant and returns its timeout once the sweep
// finds it due, as a listener would.
func lapsed(t *testing.T, store *session.Store, uid string) []session.Expired {
	t.Helper()
	ctx := context.Background()
	if _, err := store.Renew(ctx, uid, "default", 10*time.Millisecond, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	var due []session.Expired
	pollUntil(t, uid+"'s 10ms grant to fall due", func() bool {
		var err error
		if due, _, err = store.Due(ctx, 10); err != nil {
			t.Fatal(err)
		}
		return len(due) > 0
	})
	return due
}

// hold holds uid's timeout for an hour, as a listener's hold rule would:
// a 10ms grant, found due, held.
func hold(t *testing.T, store *session.Store, uid string) {
	t.Helper()
	ctx := context.Background()
	due := lapsed(t, store, uid)
	if n, err := store.Hold(ctx, due, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Hold = %d, %v; want 1", n, err)
	}
}

// TestHoldNotesRead: the entries a renewal's or an end's script appends
// when it cancels a held timeout read as the gateway's, the hold's
// recheck then the lapse stale by RuleRenewed or RuleEnded, and at when
// the script ran: a decision of the same gateway instance made before
// the renewal, whose batch reached Redis after it, still reads before
// them (the script's entries are not of a batch). With recording off
// there are no notes.
func TestHoldNotesRead(t *testing.T) {
	base, _ := newStore(t)
	ctx := context.Background()
	if n := (Settings{Off: true}).HoldNotes("gateway", "gw-1"); n != (session.HoldNotes{}) {
		t.Fatalf("notes with recording off: %+v, want none", n)
	}
	store := base.WithHoldNotes(Settings{}.HoldNotes("gateway", "gw-1"))
	hold(t, store, "hn")
	gw := NewRecorder(store, Config{Service: "gateway", Instance: "gw-1"})
	gw.Record("hn", Entry{Kind: KindStart, Rule: "started"})
	passRealTime(200 * time.Millisecond) // between the start and the renewal: more than the start batch's trip to Redis on a busy host, which its stamp does not count
	if _, err := store.Renew(ctx, "hn", "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	cancel()
	gw.Run(rctx) // the start's batch reaches Redis after the renewal
	got, err := Read(ctx, store, "hn", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Kind != KindStart || got[1].Kind != KindRechecked || got[2].Kind != KindStale || got[2].Rule != RuleRenewed {
		t.Fatalf("read %v, want the start, then the hold's recheck and the lapse stale by %s", Kinds(got), RuleRenewed)
	}
	for _, e := range got[1:] {
		if e.Service != "gateway" || e.Instance != "gw-1" || !e.InScript || e.Detail == "" {
			t.Errorf("%+v: want the gateway's gw-1, recorded in its script, with a detail", e)
		}
	}
	if !got[0].At.Before(got[1].At) || got[1].At != got[2].At {
		t.Errorf("at %v, %v, %v: want the start before the renewal's two entries, stamped as it ran", got[0].At, got[1].At, got[2].At)
	}

	// A renewal between stages, after the guide: the stages left are
	// cancelled, and the entry says which was due next, of what silence.
	due := lapsed(t, store, "hn-back")
	due[0].NextDue = due[0].Due.Add(time.Hour)
	if err := store.Settle(ctx, due); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Renew(ctx, "hn-back", "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	got, err = Read(ctx, store, "hn-back", 0)
	if err != nil || len(got) != 1 || got[0].Kind != KindGranted || got[0].Rule != RuleStagesCancelled ||
		got[0].Stage != 2 || got[0].Deadline != due[0].Deadline.UnixMilli() || !got[0].InScript || got[0].Instance != "gw-1" {
		t.Fatalf("read %+v, %v; want one entry, granted:%s, of stage 2 and the silence's deadline %d, by gw-1's script",
			got, err, RuleStagesCancelled, due[0].Deadline.UnixMilli())
	}
	// Another renewal finds no stage left: nothing more.
	if _, err := store.Renew(ctx, "hn-back", "default", time.Minute, session.ClockPresence); err != nil {
		t.Fatal(err)
	}
	if got, err = Read(ctx, store, "hn-back", 0); err != nil || len(got) != 1 {
		t.Fatalf("after a second renewal: read %v, %v; want the one entry", Kinds(got), err)
	}

	hold(t, store, "hn-end")
	if err := store.End(ctx, "hn-end"); err != nil {
		t.Fatal(err)
	}
	if got, err = Read(ctx, store, "hn-end", 0); err != nil || len(got) != 2 || got[0].Kind != KindRechecked ||
		got[1].Kind != KindStale || got[1].Rule != RuleEnded {
		t.Fatalf("read %v, %v; want the hold's recheck and the lapse stale by %s", Kinds(got), err, RuleEnded)
	}
}

// passRealTime lets at least d of real time pass. It must be real time:
// the entries' stamps are Redis's clock, which no fake clock moves; a
// busy machine only widens the gap.
func passRealTime(d time.Duration) {
	time.Sleep(d) // real time, see above
}

// pollUntil polls cond, which reads Redis, until it holds, for at most
// 10s, failing the test after.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(time.Millisecond) // a poll's pace: cond waits on Redis's clock, not on an event
	}
}

// TestViewShowsLastGrant: routine renewals are not recorded, but what a
// person reads (View: the endpoint, the command) shows, at its time, the
// user's last renewal Redis knows of, by which gateway, and the deadline
// it set; between stages, the stage due next and its silence's deadline.
// Read, the recorded decisions alone, does not.
func TestViewShowsLastGrant(t *testing.T) {
	store, _ := newStore(t)
	ctx := context.Background()
	r := session.NewRenewer(store, session.RenewerConfig{Instance: "gw-7"})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }()
	defer func() { cancel(); <-done }()

	if got, err := View(ctx, store, "nobody", 0); err != nil || len(got) != 0 {
		t.Fatalf("View of an unknown user: %v, %v; want nothing", got, err)
	}
	deadline, err := r.Renew(ctx, "vi", "default", time.Minute, session.ClockPresence)
	if err != nil {
		t.Fatal(err)
	}
	// The start is recorded after the grant, in a later millisecond: in
	// the grant's own, the two are stamped alike and either may be shown
	// first (a CI run recorded both in one).
	for granted := deadline.Add(-time.Minute).UnixMilli(); time.Now().UnixMilli() <= granted; {
		time.Sleep(100 * time.Microsecond) // the host's clock must pass the grant's ms: real time, under 1 ms
	}
	recordAll(t, store, session.TimelineBounds{}, record{uid: "vi", e: Entry{Kind: KindStart, Rule: "started"}})
	got, err := View(ctx, store, "vi", 0)
	if err != nil || len(got) != 2 {
		t.Fatalf("View: %v, %v; want the last grant and the start", Kinds(got), err)
	}
	g := got[0]
	if g.Kind != KindGranted || g.Rule != RuleLast || !g.Current || g.Instance != "gw-7" || g.Deadline != deadline.UnixMilli() || g.Stage != 0 {
		t.Errorf("the last grant: %+v; want granted:%s by gw-7, current, deadline %d", g, RuleLast, deadline.UnixMilli())
	}
	if d := deadline.Add(-time.Minute).Sub(g.At); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("the last grant at %v, want the renewal's time, a TTL before its deadline %v", g.At, deadline)
	}
	if got[1].Kind != KindStart {
		t.Errorf("after the grant: %v, want the start recorded after it", Kinds(got))
	}
	if read, err := Read(ctx, store, "vi", 0); err != nil || len(read) != 1 {
		t.Errorf("Read: %v, %v; want the recorded start alone", Kinds(read), err)
	}
	// Ended: the last renewal Redis knows of is the end, and no deadline
	// is pending: nothing to show.
	if err := store.End(ctx, "vi"); err != nil {
		t.Fatal(err)
	}
	if got, err := View(ctx, store, "vi", 0); err != nil || len(got) != 1 {
		t.Errorf("View after the end: %v, %v; want the start alone", Kinds(got), err)
	}

	// Between stages: guided, the close due in an hour.
	due := lapsed(t, store, "vs")
	due[0].NextDue = due[0].Due.Add(time.Hour)
	if err := store.Settle(ctx, due); err != nil {
		t.Fatal(err)
	}
	got, err = View(ctx, store, "vs", 0)
	if err != nil || len(got) != 1 || got[0].Stage != 2 || got[0].Deadline != due[0].Deadline.UnixMilli() {
		t.Fatalf("View between stages: %+v, %v; want the last grant, stage 2 due next, its silence's deadline %d", got, err, due[0].Deadline.UnixMilli())
	}
}

// TestRecordStorm: a storm of entries, many batches' worth, recorded while
// Run sends, every one of them from several goroutines: each reaches its
// user's timeline, in the order its goroutine recorded them, and the
// queue Run keeps for reuse afterwards is no larger than a batch.
func TestRecordStorm(t *testing.T) {
	store, _ := newStore(t)
	r := NewRecorder(store, Config{Service: "gateway", Instance: "gw-1", Bounds: session.TimelineBounds{Entries: 1000, Keep: time.Hour}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	const writers, each = 4, 3 * defaultBatch
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				r.Record(fmt.Sprintf("storm-%d-%d", w, i%8), Entry{Kind: KindStart, Conns: i})
			}
		})
	}
	wg.Wait()
	// Run sends as they come; what is still queued at its stop gets a
	// second, which a loaded host may need more than: wait for them all.
	read := func(uid string) []Entry {
		got, err := Read(context.Background(), store, uid, 0)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	pollUntil(t, "every entry in the timelines", func() bool {
		for w := range writers {
			for u := range 8 {
				if len(read(fmt.Sprintf("storm-%d-%d", w, u))) < each/8 {
					return false
				}
			}
		}
		return true
	})
	cancel()
	<-done
	for w := range writers {
		for u := range 8 {
			uid := fmt.Sprintf("storm-%d-%d", w, u)
			got := read(uid)
			if len(got) != each/8 {
				t.Fatalf("%s: %d entries, want %d", uid, len(got), each/8)
			}
			for k, e := range got {
				if want := u + 8*k; e.Conns != want {
					t.Fatalf("%s: entry %d is %d, want %d, in the order recorded", uid, k, e.Conns, want)
				}
			}
		}
	}
	r.q.mu.Lock()
	defer r.q.mu.Unlock()
	if n := len(r.q.recs) - r.q.head; n != 0 || cap(r.q.recs) > spareMax {
		t.Fatalf("queue left %d long, %d allocated; want empty, at most %d", n, cap(r.q.recs), spareMax)
	}
}
