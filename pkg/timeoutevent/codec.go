package timeoutevent

import (
	"math"
	"strconv"
)

// A hand-written encoder and decoder for the plain form of an event.
//
// The guide consumer parses every record it takes and the listener encodes
// every event it produces. Through encoding/json (reflection) a parse cost
// 4.6 µs and 15 allocations an event, checks included, and a marshal 0.9
// µs and 2 (BenchmarkParse, BenchmarkMarshal); in the profile of a storm
// of guides, parsing took about 9 µs an event, 8% of the consumer's CPU.
// By hand they cost 1.1 µs and 6 allocations, 0.5 µs and 1.
//
// The events the listener writes are flat objects of integers, bools and
// plain ASCII strings, and that form, only it, is read and written here.
// Anything unusual (an unknown or differently cased key, a duplicate key,
// null, an escape, non-ASCII, a number that is not an integer of its
// field's range, a nested value, trailing bytes) takes the encoding/json
// path, so the results are encoding/json's: the same event or error from
// Parse, the same bytes from Marshal.

// parsePlain decodes b when it is a plain event object that carries "v",
// with e.Version set from it; ok is false on anything else, for which
// Parse uses encoding/json.
func parsePlain(b []byte) (e Event, ok bool) {
	d := decoder{b: b}
	if !d.next('{') {
		return Event{}, false
	}
	var seen uint16 // a bit per field read, to refuse a duplicate
	for {
		key, ok := d.str()
		if !ok || !d.next(':') {
			return Event{}, false
		}
		var bit uint16
		switch string(key) {
		case "v":
			bit, ok = 1<<0, d.readInt(&e.Version)
		case "id":
			bit, ok = 1<<1, d.readString(&e.ID)
		case "uid":
			bit, ok = 1<<2, d.readString(&e.UID)
		case "segment":
			bit, ok = 1<<3, d.readString(&e.Segment)
		case "deadline_ms":
			bit, ok = 1<<4, d.readInt64(&e.DeadlineMS)
		case "detected_ms":
			bit, ok = 1<<5, d.readInt64(&e.DetectedMS)
		case "source":
			bit, ok = 1<<6, d.readString(&e.Source)
		case "stage":
			bit, ok = 1<<7, d.readInt(&e.Stage)
		case "due_ms":
			bit, ok = 1<<8, d.readInt64(&e.DueMS)
		case "action":
			bit, ok = 1<<9, d.readString(&e.Action)
		case "final":
			bit, ok = 1<<10, d.readBool(&e.Final)
		case "reason":
			bit, ok = 1<<11, d.readString(&e.Reason)
		case "text":
			bit, ok = 1<<12, d.readString(&e.Text)
		}
		if bit == 0 || !ok || seen&bit != 0 {
			return Event{}, false
		}
		seen |= bit
		if d.next('}') {
			break
		}
		if !d.next(',') {
			return Event{}, false
		}
	}
	d.space()
	if d.i != len(b) || seen&1 == 0 {
		return Event{}, false
	}
	return e, true
}

// decoder reads the tokens of a plain event from b[i:].
type decoder struct {
	b []byte
	i int
}

// space skips JSON whitespace.
func (d *decoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// next reads c, after whitespace.
func (d *decoder) next(c byte) bool {
	d.space()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// str reads a plain string: printable ASCII, without quote or backslash.
func (d *decoder) str() ([]byte, bool) {
	if !d.next('"') {
		return nil, false
	}
	for start := d.i; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			d.i++
			return d.b[start : d.i-1], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// values are the sources, actions and reasons: read without an allocation.
var values = [...]string{SourceSweep, SourceEvent, ActionRemind, ActionClose, ActionNotify, ReasonInactive, ReasonEnded}

func (d *decoder) readString(p *string) bool {
	s, ok := d.str()
	if !ok {
		return false
	}
	for _, v := range values {
		if string(s) == v {
			*p = v
			return true
		}
	}
	*p = string(s)
	return true
}

// integer reads a JSON integer within [lo, hi]: an optional minus, then
// digits without a leading zero. A fraction or an exponent is left unread,
// so the object's next token is wrong and the event is not plain.
func (d *decoder) integer(lo, hi int64) (int64, bool) {
	d.space()
	neg := d.i < len(d.b) && d.b[d.i] == '-'
	if neg {
		d.i++
	}
	start := d.i
	var n uint64
	for ; d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9'; d.i++ {
		if d.i-start == 19 { // more than any int64 has
			return 0, false
		}
		n = n*10 + uint64(d.b[d.i]-'0')
	}
	switch digits := d.i - start; {
	case digits == 0, digits > 1 && d.b[start] == '0':
		return 0, false
	case neg && n <= uint64(-(lo+1))+1:
		return -int64(n), true // -(1<<63) wraps to itself, lo of int64
	case !neg && n <= uint64(hi):
		return int64(n), true
	}
	return 0, false
}

func (d *decoder) readInt64(p *int64) bool {
	n, ok := d.integer(math.MinInt64, math.MaxInt64)
	*p = n
	return ok
}

func (d *decoder) readInt(p *int) bool {
	n, ok := d.integer(math.MinInt, math.MaxInt)
	*p = int(n)
	return ok
}

func (d *decoder) readBool(p *bool) bool {
	d.space()
	for _, lit := range [...]string{"false", "true"} {
		if len(d.b)-d.i >= len(lit) && string(d.b[d.i:d.i+len(lit)]) == lit {
			d.i += len(lit)
			*p = lit == "true"
			return true
		}
	}
	return false
}

// plain reports whether json.Marshal writes s as it is, between quotes:
// printable ASCII but the quote, the backslash and the three it escapes
// for HTML (<, >, &).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// marshalPlain encodes e as json.Marshal does when all its strings are
// plain; ok is false, and nothing is encoded, when one is not.
func marshalPlain(e *Event) (b []byte, ok bool) {
	if !plain(e.ID) || !plain(e.UID) || !plain(e.Segment) || !plain(e.Source) ||
		!plain(e.Action) || !plain(e.Reason) || !plain(e.Text) {
		return nil, false
	}
	// The keys and punctuation take 145 bytes at most, the five numbers
	// 20 each.
	const fixed = 145 + 5*20
	b = make([]byte, 0, fixed+len(e.ID)+len(e.UID)+len(e.Segment)+len(e.Source)+len(e.Action)+len(e.Reason)+len(e.Text))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(e.Version), 10)
	b = appendString(b, `,"id":"`, e.ID)
	b = appendString(b, `,"uid":"`, e.UID)
	b = appendString(b, `,"segment":"`, e.Segment)
	b = append(b, `,"deadline_ms":`...)
	b = strconv.AppendInt(b, e.DeadlineMS, 10)
	b = append(b, `,"detected_ms":`...)
	b = strconv.AppendInt(b, e.DetectedMS, 10)
	b = appendString(b, `,"source":"`, e.Source)
	b = append(b, `,"stage":`...)
	b = strconv.AppendInt(b, int64(e.Stage), 10)
	b = append(b, `,"due_ms":`...)
	b = strconv.AppendInt(b, e.DueMS, 10)
	b = appendString(b, `,"action":"`, e.Action)
	b = append(b, `,"final":`...)
	b = strconv.AppendBool(b, e.Final)
	if e.Reason != "" { // omitempty
		b = appendString(b, `,"reason":"`, e.Reason)
	}
	if e.Text != "" { // omitempty
		b = appendString(b, `,"text":"`, e.Text)
	}
	return append(b, '}'), true
}

// appendString appends key, which ends with the value's opening quote,
// then the plain s and its closing quote.
func appendString(b []byte, key, s string) []byte {
	b = append(b, key...)
	b = append(b, s...)
	return append(b, '"')
}
