package session

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A user's timeline is what stillthere decided about them and why, for
// the platform's support team (package timeline gives the entries their
// meaning; here they are opaque text). Each service appends the
// decisions it makes; Redis stamps each with its own clock, the clock
// every deadline is on, so that entries from different machines sort
// and read together.

var (
	timelineAddScript  = newScript[timelineAddKeys]("timeline_add", nil, nil)
	timelineReadScript = newScript[timelineKeys]("timeline_read", nil, nil)
)

// TimelineRecord is one entry for uid's timeline.
type TimelineRecord struct {
	UID   string
	Entry string
	// Ago is how long before the append the decision was made (its time
	// in the recorder's queue): the entry is stamped Redis's now less Ago.
	Ago time.Duration
}

// TimelineBounds bound every user's timeline.
type TimelineBounds struct {
	// Entries is the most a timeline keeps: the oldest go first.
	Entries int
	// Keep is how long a timeline outlives its last entry; readers skip
	// entries older than it (TimelineEntry.At).
	Keep time.Duration
}

// OrDefault fills zero bounds with the defaults: 100 entries, 24h.
func (b TimelineBounds) OrDefault() TimelineBounds {
	if b.Entries <= 0 {
		b.Entries = 100
	}
	if b.Keep <= 0 {
		b.Keep = 24 * time.Hour
	}
	return b
}

// HoldNotes say who records, and within what bounds, what a Store's
// renewals and ends append to a user's timeline when they cancel the
// user's held timeout: in the script that cancels it, stamped by Redis's
// clock as it runs, so that the timeline says what became of the hold
// whatever became of the listener replica that held it (a restart, the
// read-ahead path off). Two entries (holdNotes): the hold's recheck, and
// the lapse stale, by rule renewed when a grant cancelled the hold (a
// renewal, an activity event), ended when an end did (a last close, End,
// the platform's end of the conversation). Only that rare branch writes:
// a renewal that finds nothing held touches no timeline. A renewal of
// mode "lapsed" (see renewScript) records nothing: the silence it
// restores is due again, and the listener records what becomes of it.
// The timeline package gives a service's (Settings.HoldNotes); the zero
// value records nothing, as a service whose timeline recording is off.
type HoldNotes struct {
	// Bounds of the timelines written, as AppendTimeline takes them.
	Bounds TimelineBounds
	// Service and Instance record the entries: the gateway, and its
	// instance.
	Service, Instance string
}

// on says whether n records anything.
func (n HoldNotes) on() bool {
	return n.Bounds.Entries >= 1 && n.Bounds.Keep >= time.Millisecond && n.Service != ""
}

// args appends to argv a script's note block: the most entries, the keep
// in ms (0, 0 when off: nothing is recorded), the service and the
// instance. Only these travel with each call; the entries' words are in
// the scripts' source (holdNoteCodec).
func (n HoldNotes) args(argv []any) []any {
	if !n.on() {
		return append(argv, 0, 0, "", "")
	}
	return append(argv, n.Bounds.Entries, n.Bounds.Keep.Milliseconds(), n.Service, n.Instance)
}

// offNotes is the note block of a Store that records nothing.
var offNotes = HoldNotes{}.args(nil)

// noteBlock is the note block of the store's renewals and ends.
func (s *Store) noteBlock() []any {
	if s.notes == nil {
		return offNotes
	}
	return s.notes
}

// withNotes is argv with the store's note block after it, in one
// allocation: every renewal builds one.
func (s *Store) withNotes(argv ...any) []any {
	notes := s.noteBlock()
	return append(append(make([]any, 0, len(argv)+len(notes)), argv...), notes...)
}

// holdNote is an entry the scripts append when they cancel a hold, as
// package timeline stores its Entry (JSON, stamped as timeline_add.lua
// stamps one), less the service and instance each call gives: the kind
// and rule are timeline's (its tests read the entries back as its own).
type holdNote struct {
	Kind     string `json:"kind"`
	Rule     string `json:"rule,omitempty"`
	Detail   string `json:"detail"`
	InScript bool   `json:"in_script"` // not of a Recorder's batch: At is exact
}

// holdNotes are the entries, in the order appended: Rechecked, then one
// of Renewed and Ended. StagesCancelled stands alone: a grant (a renewal,
// an activity event, a turn) that ended a silence between its stages
// (the script adds the stage that was due next and the silence's
// deadline). Whether the stage before reached the user the script cannot
// know: it was produced, or went to a spool, and the consumer may have
// found the user back since.
var holdNotes = struct{ Rechecked, Renewed, Ended, StagesCancelled holdNote }{
	Rechecked: holdNote{Kind: "rechecked", Detail: "its hold was cancelled before its release", InScript: true},
	Renewed:   holdNote{Kind: "stale", Rule: "renewed", Detail: "the user renewed while it was held", InScript: true},
	Ended:     holdNote{Kind: "stale", Rule: "ended", Detail: "the session ended while it was held", InScript: true},
	StagesCancelled: holdNote{Kind: "granted", Rule: "stages-cancelled",
		Detail: "a grant (a renewal, activity, a turn) between the silence's stages: this stage and the rest cancelled", InScript: true},
}

// holdNoteCodec writes, into a script's source, each of holdNotes as
// the Lua string of its JSON fields, holdNote<Name>, and
// encodeHoldNote(note, service, instance), which makes the stored entry
// of one: the words are in the source, not in each call's ARGV, as every
// renewal would carry them and nearly none uses them.
type holdNoteCodec struct{}

func (holdNoteCodec) lua() string {
	var b strings.Builder
	v := reflect.ValueOf(holdNotes)
	for i := range v.NumField() {
		js, err := json.Marshal(v.Field(i).Interface())
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(&b, "local holdNote%s = %s\n", v.Type().Field(i).Name, luaString(string(js[1:len(js)-1])))
	}
	b.WriteString(`local function encodeHoldNote(note, service, instance)
  return '{"service":' .. cjson.encode(service) .. ',"instance":' .. cjson.encode(instance) .. ',' .. note .. '}'
end
`)
	return b.String()
}

// luaString is s as a Lua string literal: printable ASCII only, which
// Lua 5.1 reads back the same once its backslashes and quotes are
// escaped.
func luaString(s string) string {
	for _, c := range []byte(s) {
		if c < 0x20 || c > 0x7e {
			panic(fmt.Sprintf("%q: not printable ASCII, which a Lua literal would not keep", s))
		}
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// AppendTimeline appends records to their users' timelines, in order per
// user, in one pipelined round trip (one script call per bucket), and
// says of each whether Redis took it, with the first error. Each is stamped with
// its decision's time by Redis's clock: Redis's now less its Ago.
func (s *Store) AppendTimeline(ctx context.Context, recs []TimelineRecord, b TimelineBounds) ([]bool, error) {
	if b.Entries < 1 || b.Keep < time.Millisecond {
		return make([]bool, len(recs)), fmt.Errorf("timeline bounds %d entries, keep %v: want at least 1 and 1ms", b.Entries, b.Keep)
	}
	groups := bucketGroups(len(recs), func(i int) string { return recs[i].UID })
	cmds := s.runScripts(ctx, len(groups), func(i int) (*redis.Script, []string, []any) {
		var keys timelineAddKeys
		args := []any{b.Entries, b.Keep.Milliseconds()}
		for _, j := range groups[i] {
			keys.Entries = append(keys.Entries, s.ks.TimelineKey(recs[j].UID))
			args = append(args, max(0, recs[j].Ago.Milliseconds()), recs[j].Entry)
		}
		return timelineAddScript.call(keys, args...)
	}, DefaultSlotRetry)
	appended := make([]bool, len(recs))
	var first error
	for i, c := range cmds {
		refused, err := c.Slice()
		if err != nil {
			if first == nil {
				first = fmt.Errorf("append timeline of %q: %w", recs[groups[i][0]].UID, err)
			}
			continue
		}
		for _, j := range groups[i] {
			appended[j] = true
		}
		// Positions among the call's entries, from 1, each with its error.
		for k := 0; k+1 < len(refused); k += 2 {
			pos, ok := refused[k].(int64)
			if !ok || pos < 1 || int(pos) > len(groups[i]) {
				continue
			}
			j := groups[i][pos-1]
			appended[j] = false
			if first == nil {
				first = fmt.Errorf("append timeline of %q: %v", recs[j].UID, refused[k+1])
			}
		}
	}
	return appended, first
}

// TimelineEntry is one stored entry of a timeline.
type TimelineEntry struct {
	At    time.Time // by Redis's clock, when its decision was made
	Entry string
	// Err says why the stored entry did not parse: Entry is all of it,
	// and At the time of the entry appended before it (zero if none).
	Err error
}

// Timeline reads uid's timeline in the order appended, and Redis's clock
// when it read it. Services append in batches, so an entry may follow
// one it is older than (see TimelineEntry.At). An unknown user has an
// empty timeline.
func (s *Store) Timeline(ctx context.Context, uid string) (time.Time, []TimelineEntry, error) {
	res, err := timelineReadScript.Run(ctx, s.rdb, timelineKeys{Timeline: s.ks.TimelineKey(uid)}).Slice()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read timeline of %q: %w", uid, err)
	}
	now, items, err := parseTimeline(res)
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read timeline of %q: %w", uid, err)
	}
	return now, items, nil
}

// parseTimeline reads timeline_read.lua's reply.
func parseTimeline(res []any) (time.Time, []TimelineEntry, error) {
	if len(res) != 2 {
		return time.Time{}, nil, fmt.Errorf("%w: %d values, want 2", errReply, len(res))
	}
	now, ok := res[0].(int64)
	if !ok {
		return time.Time{}, nil, fmt.Errorf("%w: clock %v", errReply, res[0])
	}
	list, ok := res[1].([]any)
	if !ok {
		return time.Time{}, nil, fmt.Errorf("%w: entries %v", errReply, res[1])
	}
	out := make([]TimelineEntry, 0, len(list))
	for _, v := range list {
		raw, _ := v.(string)
		e, err := ParseTimelineEntry(raw)
		if err != nil {
			// Shown to the reader as it is, not hiding the rest, where it
			// was appended: at the time of the entry before it.
			e = TimelineEntry{Entry: raw, Err: err}
			if len(out) > 0 {
				e.At = out[len(out)-1].At
			}
		}
		out = append(out, e)
	}
	return time.UnixMilli(now), out, nil
}

// ParseTimelineEntry reads one stored entry: "<Redis ms> <entry>".
func ParseTimelineEntry(raw string) (TimelineEntry, error) {
	ms, entry, ok := strings.Cut(raw, " ")
	if !ok {
		return TimelineEntry{}, fmt.Errorf("%w: timeline entry %q has no time", errReply, raw)
	}
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || at <= 0 {
		return TimelineEntry{}, fmt.Errorf("%w: timeline entry %q: bad time", errReply, raw)
	}
	return TimelineEntry{At: time.UnixMilli(at), Entry: entry}, nil
}

// lastGrantScript reads what Redis knows of one user's last grant
// (LastGrant). ARGV: uid.
var lastGrantScript = newScript[sessionKeys]("last_grant", nil, nil)

// LastGrant is what Redis knows of a user's last grant, read beside their
// timeline: routine renewals are not recorded there (a timeline grows
// with silences, not with pings), and the last one is all a reader needs
// to see how a deadline came about.
type LastGrant struct {
	// At is the user's last renewal, or their session's end, by Redis's
	// clock (the ping's time for a resync); zero when Redis remembers
	// none (RenewedKeep after the session).
	At time.Time
	// Deadline is the session's deadline while one is pending, or the
	// deadline of the silence whose stage Stage is due next (Due).
	Deadline time.Time
	Stage    int
	Due      time.Time
	// Vias are the gateway instances of the grant the deadline is, then
	// the one that renewed last (Expired.Vias).
	Vias []string
}

// LastGrant reads what Redis knows of uid's last grant.
func (s *Store) LastGrant(ctx context.Context, uid string) (LastGrant, error) {
	res, err := lastGrantScript.Run(ctx, s.rdb, s.ks.sessionKeys(uid), uid).StringSlice()
	if err == nil && len(res) != 4 {
		err = fmt.Errorf("%w: %d values, want 4", errReply, len(res))
	}
	if err != nil {
		return LastGrant{}, fmt.Errorf("read the last grant of %q: %w", uid, err)
	}
	var g LastGrant
	if ms, err := strconv.ParseInt(res[0], 10, 64); err == nil {
		g.At = time.UnixMilli(ms)
	}
	score, err := strconv.ParseFloat(res[1], 64)
	if err == nil {
		g.Deadline = time.UnixMilli(int64(score))
		if stage, deadline, ok := parseStage(res[2]); ok {
			g.Stage, g.Due, g.Deadline = stage, g.Deadline, deadline
		}
	}
	if res[3] != "" {
		g.Vias = Expired{Via: res[3]}.Vias()
	}
	return g, nil
}
