package session

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// keyListTypes are the key lists of every script.
var keyListTypes = []keyList{
	bucketKeys{}, sessionKeys{}, grantKeys{}, lookupKeys{}, entryKeys{}, dueKeys{}, setKeys{}, stagedKeys{},
	heartbeatKeys{}, blindKeys{}, markKeys{}, lapseKeys{}, aliveKeys{}, routeKeys{}, routeStampKeys{},
	dedupKeys{}, pushClaimKeys{}, deliveredKeys{}, inboxKeepKeys{}, inboxTakeKeys{}, checkKeys{},
	dedupEachKeys{}, activityKeys{}, feedKeys{},
}

// TestKeyListsFollowTheirFields: each key list's list() gives its keys
// in the order of its fields, the order its script's K table names them
// by (keyTable): a list() that swaps two keys would have a script write
// one where it means the other.
func TestKeyListsFollowTheirFields(t *testing.T) {
	for _, kl := range keyListTypes {
		typ := reflect.TypeOf(kl)
		t.Run(typ.Name(), func(t *testing.T) {
			v := reflect.New(typ).Elem()
			fill(v)
			names, tail := keyNames(typ)
			want := names
			if tail != "" {
				want = append(want, tail+"1", tail+"2")
			}
			if got := v.Interface().(keyList).list(); !slices.Equal(got, want) {
				t.Errorf("list() = %q, want the fields in order %q", got, want)
			}
			table := keyTable(typ)
			for i, n := range names {
				if !strings.Contains(table, n+" = "+strconv.Itoa(i+1)) {
					t.Errorf("key table %q does not name %s %d", table, n, i+1)
				}
			}
		})
	}
}

// fill sets each string field of a key list to its Lua name, and a tail
// to two keys named after it.
func fill(v reflect.Value) {
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		switch {
		case sf.Anonymous:
			fill(f)
		case f.Kind() == reflect.String:
			f.SetString(luaName(sf.Name))
		case f.Kind() == reflect.Slice:
			n := luaName(sf.Name)
			f.Set(reflect.ValueOf([]string{n + "1", n + "2"}))
		}
	}
}

// TestFormatsAgree: what Go encodes, the Lua of the same format decodes
// to the same fields, and what that Lua encodes, Go decodes; a value of
// another layout is refused by both.
func TestFormatsAgree(t *testing.T) {
	s, ctx := newStore(t)
	tests := []struct {
		f    format
		vals [][]string
		bad  []string
	}{
		{stageFormat, [][]string{{"2", "1763720000123"}, {"10", "1"}}, []string{"", "2", "2:", "x:1", "2:1:3", "-2:5"}},
		{aliveFormat, [][]string{{"1763720000123", "30000"}, {"5", "0"}}, []string{"", "5", "5:", "5:x", " 5:1", "5:1:2"}},
		{blindFormat, [][]string{{"1", "2", BlindGateway, "gw-1"}, {"1", "2", BlindSweepGap, ""}, {"1", "2", BlindDrain, "a:b:c"}},
			[]string{"", "1:2:x", "a:2:x:", "1:-2:x:"}},
		{listenerFormat, [][]string{{"1763720000123", ""}, {"1763720000123", listenerFailing}}, []string{"", "x", ":failing"}},
		{viaFormat, [][]string{{"gw-1", ""}, {"gw-1", "gw-2"}, {"", ""}}, nil},
		{dedupFormat, [][]string{{DedupClaimed, "l1:abc"}, {dedupProduced, "1763720000123"}, {dedupRetry, "2"}, {ClaimFresh, "0"}},
			[]string{"", dedupProduced, ClaimBusy}},
		{pushFormat, [][]string{{pushClaimed, "0123abcd"}, {pushDone, "delivered"}}, []string{"", "x"}},
		{runIDFormat, [][]string{{"9a1f0c3e5b7d2468", "7"}, {"9a1f0c3e5b7d2468", ""}, {"", ""}}, nil},
	}
	roundtrip := testdataLua(t, "format_roundtrip")
	for _, tc := range tests {
		t.Run(tc.f.name, func(t *testing.T) {
			codec := strings.NewReplacer("encode"+tc.f.name+"(", "encodeF(", "decode"+tc.f.name+"(", "decodeF(").Replace(tc.f.lua())
			script := redis.NewScript(codec + roundtrip)
			for _, vals := range tc.vals {
				enc := tc.f.encode(vals...)
				got, err := script.Run(ctx, s.rdb, nil, append([]any{enc}, anys(vals)...)...).StringSlice()
				if err != nil {
					t.Fatal(err)
				}
				if len(got) == 0 || got[0] != enc {
					t.Errorf("Lua encodes %q as %q, Go as %q", vals, got, enc)
					continue
				}
				want := slices.Clone(vals)
				if !slices.Equal(got[1:], want) {
					t.Errorf("Lua decodes %q as %q, want %q", enc, got[1:], want)
				}
				if dec, ok := tc.f.decode(enc); !ok || !slices.Equal(dec, want) {
					t.Errorf("Go decodes %q as %q, %v; want %q", enc, dec, ok, want)
				}
			}
			for _, v := range tc.bad {
				if dec, ok := tc.f.decode(v); ok {
					t.Errorf("Go decodes %q, not of the format, as %q", v, dec)
				}
				fields := make([]any, len(tc.f.fields))
				for i := range fields {
					fields[i] = "1"
				}
				got, err := script.Run(ctx, s.rdb, nil, append([]any{v}, fields...)...).StringSlice()
				if err != nil {
					t.Fatal(err)
				}
				if len(got) > 1 {
					t.Errorf("Lua decodes %q, not of the format, as %q", v, got[1:])
				}
			}
		})
	}
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestVocabularyInTheSource: a script's vocabulary is written into its
// source as literals, which Redis reads back as the Go values, quotes and
// backslashes too; and no call passes it in ARGV any more (a renewal's
// call carries only its own arguments).
func TestVocabularyInTheSource(t *testing.T) {
	s, ctx := newStore(t)
	var b strings.Builder
	vocabulary(&b, struct{ Plain, Quoted, Sep string }{"resync", `a'b\c"d`, ":"})
	b.WriteString("return {V.plain, V.quoted, V.sep, #ARGV}")
	got, err := s.rdb.Eval(ctx, b.String(), nil, "x").Slice()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"resync", `a'b\c"d`, ":", int64(1)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("V and #ARGV = %v, want %v", got, want)
	}
	_, _, args := renewScript.call(grantKeys{}, "only", "these")
	if len(args) != 2 {
		t.Errorf("a call of renewScript passes %d ARGV for 2 arguments: %v", len(args), args)
	}
}
