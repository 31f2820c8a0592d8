package session

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRunIDFormat: the run id key's value as the release before wrote it
// and still reads it, so that a listener of that release marking beside
// one of this finds the value it wrote itself: "<run id>" on a single
// Redis, "<run id>/<epoch>" on a cluster; and Go and Lua agree on it
// (TestFormatsAgree runs the same cases through Lua).
func TestRunIDFormat(t *testing.T) {
	const run = "9a1f0c3e5b7d2468ace013579bdf2468ace01357"
	tests := []struct {
		stored     string
		run, epoch string
		rewritten  string // what this release writes for the fields
	}{
		{run, run, "", run},
		{run + "/7", run, "7", run + "/7"},
		// A cluster whose CLUSTER INFO gave no epoch, which the release
		// before wrote with its slash; Redis always gives one.
		{run + "/", run, "", run},
		{"", "", "", ""},
	}
	for _, tc := range tests {
		f, ok := runIDFormat.decode(tc.stored)
		if !ok || f[0] != tc.run || f[1] != tc.epoch {
			t.Errorf("decode(%q) = %q, %v; want %q, %q", tc.stored, f, ok, tc.run, tc.epoch)
		}
		if got := runIDFormat.encode(tc.run, tc.epoch); got != tc.rewritten {
			t.Errorf("encode(%q, %q) = %q, want %q", tc.run, tc.epoch, got, tc.rewritten)
		}
	}
}

// TestMarkStoresRunID: on a single Redis, the sweep mark stores the run
// id alone, as the release before did, and Go reads it back as the
// server's run id.
func TestMarkStoresRunID(t *testing.T) {
	s, ctx := newStore(t)
	if _, err := s.Mark(ctx, SweepMark{GapMax: time.Hour, Keep: time.Hour}); err != nil {
		t.Fatal(err)
	}
	stored, err := s.rdb.Get(ctx, s.ks.RunIDKey()).Result()
	if err != nil {
		t.Fatal(err)
	}
	info := s.rdb.Info(ctx, "server").Val()
	_, rest, _ := strings.Cut(info, "run_id:")
	want, _, _ := strings.Cut(rest, "\r\n")
	if stored != want {
		t.Errorf("run id key holds %q, want the run id %q alone", stored, want)
	}
	if f, ok := runIDFormat.decode(stored); !ok || f[0] != want || f[1] != "" {
		t.Errorf("decode(%q) = %q, %v", stored, f, ok)
	}
}

// TestRolesFormatAgree: a map of roles Go encodes, the Lua of the same
// format decodes to the same map and encodes to the same bytes; values
// of another layout (the epoch a release before stored, a stray entry)
// read as the entries of the format they hold.
func TestRolesFormatAgree(t *testing.T) {
	s, ctx := newStore(t)
	codec := strings.NewReplacer("encodeRoles(", "encodeM(", "decodeRoles(", "decodeM(").Replace(rolesFormat.lua())
	script := redis.NewScript(codec + testdataLua(t, "map_roundtrip"))
	run := func(v string, m map[string]string) (enc string, dec map[string]string) {
		t.Helper()
		args := []any{v}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			args = append(args, k, m[k])
		}
		got, err := script.Run(ctx, s.rdb, nil, args...).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		dec = map[string]string{}
		for i := 1; i+1 < len(got); i += 2 {
			dec[got[i]] = got[i+1]
		}
		return got[0], dec
	}
	for _, m := range []map[string]string{
		{},
		{"a1": "M"},
		{"e5": "m", "a1": "M", "d4": "r", "c3": "f", "b2": "M"},
		{"07c37dfeb235213a872192d90877d0cd55635b91": "M", "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca": "r"},
	} {
		enc := rolesFormat.encode(m)
		luaEnc, luaDec := run(enc, m)
		if luaEnc != enc {
			t.Errorf("Lua encodes %v as %q, Go as %q", m, luaEnc, enc)
		}
		if !maps.Equal(luaDec, m) {
			t.Errorf("Lua decodes %q as %v, want %v", enc, luaDec, m)
		}
		if dec := rolesFormat.decode(enc); !maps.Equal(dec, m) {
			t.Errorf("Go decodes %q as %v, want %v", enc, dec, m)
		}
	}
	if enc := rolesFormat.encode(map[string]string{"b2": "r", "a1": "M"}); enc != "a1:M,b2:r" {
		t.Errorf("encode = %q, want the entries sorted, as \"a1:M,b2:r\"", enc)
	}
	for v, want := range map[string]map[string]string{
		"":              {},
		"4":             {}, // the epoch, as a release before stored it
		"a1:M,,b2:r":    {"a1": "M", "b2": "r"},
		"a1:M,stray":    {"a1": "M"},
		"a1:M,a1:r":     {"a1": "r"},
		"a1:M,b2:r,":    {"a1": "M", "b2": "r"},
		"a1:M:x,b2:r\n": {"a1": "M:x", "b2": "r\n"},
	} {
		if dec := rolesFormat.decode(v); !maps.Equal(dec, want) {
			t.Errorf("Go decodes %q as %v, want %v", v, dec, want)
		}
		if _, dec := run(v, nil); !maps.Equal(dec, want) {
			t.Errorf("Lua decodes %q as %v, want %v", v, dec, want)
		}
	}
}

// TestInboxFormatAgree: an entry Go encodes from a request and its
// times, the Lua of the same format encodes to the same bytes and decodes
// to the same fields; entries of the gateways before the added fields,
// and values that are no JSON object, read the same in both.
func TestInboxFormatAgree(t *testing.T) {
	s, ctx := newStore(t)
	codec := strings.NewReplacer("encodeInboxEntry(", "encodeO(", "decodeInboxEntry(", "decodeO(").Replace(inboxFormat.lua())
	script := redis.NewScript(codec + testdataLua(t, "object_roundtrip"))
	lua := func(obj, v string, added ...string) (enc string, fields []string) {
		t.Helper()
		args := []any{obj, v}
		for _, a := range added {
			args = append(args, a)
		}
		got, err := script.Run(ctx, s.rdb, nil, args...).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		fields = got[1:]
		if len(fields) == 1 && fields[0] == "" { // decode's nil: not an object
			fields = nil
		}
		return got[0], fields
	}
	const req = `{"id":"g1","uid":"alice","segment":"vip","text":"Still there?","deadline_ms":1763720000123,"stage":1}`
	tests := []struct {
		req   string
		added []string // kept, expires, closed
		want  []string // id, deadline, kept, expires, closed
	}{
		{req, []string{"1763720000200", "1763720300123", ""},
			[]string{"g1", "1763720000123", "1763720000200", "1763720300123", ""}},
		{req, []string{"1763720000200", "1763720300200", "1763720000200"},
			[]string{"g1", "1763720000123", "1763720000200", "1763720300200", "1763720000200"}},
		{`{"id":"g2","uid":"bob","text":"x"}`, []string{"5", "6", ""}, []string{"g2", "", "5", "6", ""}},
	}
	for _, tc := range tests {
		enc, ok := inboxFormat.encode(tc.req, tc.added...)
		if !ok {
			t.Fatalf("encode(%q) refused", tc.req)
		}
		luaEnc, luaDec := lua(tc.req, enc, tc.added...)
		if luaEnc != enc {
			t.Errorf("Lua encodes %q as %q, Go as %q", tc.added, luaEnc, enc)
		}
		if !slices.Equal(luaDec, tc.want) {
			t.Errorf("Lua decodes %q as %q, want %q", enc, luaDec, tc.want)
		}
		if dec, ok := inboxFormat.decode(enc); !ok || !slices.Equal(dec, tc.want) {
			t.Errorf("Go decodes %q as %q, %v; want %q", enc, dec, ok, tc.want)
		}
	}
	// Values as stored before, or by no one: both read the same.
	for v, want := range map[string][]string{
		// A gateway before the added fields: the request alone.
		`{"id":"old-1","uid":"lea","text":"Are you still there?"}`: {"old-1", "", "", "", ""},
		// The release before closed_ms.
		`{"id":"g","uid":"u","text":"t","deadline_ms":10,"kept_ms":11,"expires_ms":12}`: {"g", "10", "11", "12", ""},
		`{"id":7,"deadline_ms":"10","kept_ms":1.5,"expires_ms":1e3,"closed_ms":null}`:   {"", "", "", "1000", ""},
		`{}`:              {"", "", "", "", ""},
		`not json`:        nil,
		`"a string"`:      nil,
		`null`:            nil,
		`{"id":"g"} junk`: nil,
	} {
		_, luaDec := lua(req, v, "1", "2", "")
		goDec, ok := inboxFormat.decode(v)
		if !ok {
			goDec = nil
		}
		if !slices.Equal(goDec, want) || !slices.Equal(luaDec, want) {
			t.Errorf("%q: Go decodes it as %q, Lua as %q; want %q", v, goDec, luaDec, want)
		}
	}
	for _, obj := range []string{"", "{}", "[1]", "x"} {
		if enc, ok := inboxFormat.encode(obj, "1", "2", ""); ok {
			t.Errorf("encode(%q) = %q: no object with a field to add to", obj, enc)
		}
	}
}

// TestKeptEntryReadsBack: what the keep script stores is the entry Go
// encodes from the request and the times it reads back from it, byte for
// byte, with the times the keep was asked for.
func TestKeptEntryReadsBack(t *testing.T) {
	s, ctx := newStore(t)
	now := redisNow(t, s.rdb).Truncate(time.Millisecond)
	for _, closed := range []bool{false, true} {
		uid := "u" + strconv.FormatBool(closed)
		req := `{"id":"g-` + uid + `","uid":"` + uid + `","text":"Still there?","deadline_ms":` + strconv.FormatInt(now.UnixMilli(), 10) + `}`
		k := Keep{Entry: []byte(req), MaxAge: time.Hour, From: now.UnixMilli(), Cap: 5, TTL: time.Hour, Closed: closed}
		if n, err := s.KeepGuide(ctx, uid, k); err != nil || n != KeptQueued {
			t.Fatalf("KeepGuide = %d, %v", n, err)
		}
		stored, err := s.rdb.LIndex(ctx, s.ks.InboxKey(uid), 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		e, ok := decodeInboxEntry(stored)
		if !ok || e.ID != "g-"+uid || e.DeadlineMS != now.UnixMilli() || e.KeptMS < now.UnixMilli() ||
			e.ExpiresMS != now.Add(time.Hour).UnixMilli() || (e.ClosedMS != 0) != closed || (closed && e.ClosedMS != e.KeptMS) {
			t.Errorf("closed %v: stored %q reads as %+v, %v", closed, stored, e, ok)
		}
		if again, ok := encodeInboxEntry([]byte(req), e); !ok || again != stored {
			t.Errorf("closed %v: Go encodes the request with the times read back as %q, stored %q", closed, again, stored)
		}
	}
}

// FuzzFieldFormats: whatever a field format decodes, it encodes to a
// value that decodes to the same fields.
func FuzzFieldFormats(f *testing.F) {
	formats := []format{stageFormat, aliveFormat, blindFormat, listenerFormat, viaFormat, dedupFormat, pushFormat, runIDFormat}
	f.Add(uint8(7), "9a1f0c3e/7")
	f.Add(uint8(7), "9a1f0c3e/")
	f.Add(uint8(2), "1:2:gateway-gap:gw:1")
	f.Add(uint8(4), "gw-1,gw-2")
	f.Fuzz(func(t *testing.T, which uint8, v string) {
		fm := formats[int(which)%len(formats)]
		vals, ok := fm.decode(v)
		if !ok {
			return
		}
		again, ok := fm.decode(fm.encode(vals...))
		if !ok || !slices.Equal(again, vals) {
			t.Fatalf("%s: %q decodes as %q, which encodes to %q, which decodes as %q, %v",
				fm.name, v, vals, fm.encode(vals...), again, ok)
		}
	})
}

// FuzzRolesFormat: whatever the roles decode to encodes to a value that
// decodes to the same map.
func FuzzRolesFormat(f *testing.F) {
	f.Add("a1:M,b2:r,c3:f,d4:m")
	f.Add("4")
	f.Add("a1:M,,stray")
	f.Fuzz(func(t *testing.T, v string) {
		m := rolesFormat.decode(v)
		enc := rolesFormat.encode(m)
		if again := rolesFormat.decode(enc); !maps.Equal(again, m) {
			t.Fatalf("%q decodes as %v, which encodes to %q, which decodes as %v", v, m, enc, again)
		}
	})
}

// FuzzInboxEntry: an entry decodes without a panic; a request with none
// of the added fields, encoded with times, decodes to its own id and
// deadline and those times.
func FuzzInboxEntry(f *testing.F) {
	f.Add(`{"id":"g1","uid":"alice","text":"t","deadline_ms":1763720000123}`, int64(1763720000200), int64(0))
	f.Add(`{"id":"old-1","uid":"lea","text":"t"}`, int64(5), int64(5))
	f.Add(`{"id":"g","kept_ms":1}`, int64(1), int64(0))
	f.Add(`[1]`, int64(1), int64(0))
	f.Fuzz(func(t *testing.T, req string, kept, closed int64) {
		e, ok := decodeInboxEntry(req)
		if !ok || e.KeptMS != 0 || e.ExpiresMS != 0 || e.ClosedMS != 0 || kept <= 0 || kept == math.MaxInt64 || closed < 0 {
			return
		}
		want := inboxEntry{ID: e.ID, DeadlineMS: e.DeadlineMS, KeptMS: kept, ExpiresMS: kept + 1, ClosedMS: closed}
		enc, ok := encodeInboxEntry([]byte(req), want)
		if !ok {
			return
		}
		if got, ok := decodeInboxEntry(enc); !ok || got != want {
			t.Fatalf("%q with %+v encodes to %q, which decodes as %+v, %v", req, want, enc, got, ok)
		}
	})
}
