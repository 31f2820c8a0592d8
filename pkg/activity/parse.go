package activity

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/stillthere/stillthere/pkg/userid"
)

// ParseBatch parses a batch, {"events": [...]}, of 1 to MaxEvents events,
// judging each at_ms against now. The first bad event or field refuses
// the whole batch: the error is a *FieldError naming it, or
// ErrTooManyEvents.
func ParseBatch(body []byte, now time.Time) ([]Event, error) {
	p, err := newParser(body, -1)
	if err != nil {
		return nil, err
	}
	if err := p.open('{', "", "want a JSON object"); err != nil {
		return nil, err
	}
	var events []Event
	seen := false
	for p.dec.More() {
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		if key != "events" {
			return nil, p.fail(key, "unknown field")
		}
		if seen {
			return nil, p.fail(key, "given twice")
		}
		seen = true
		if err := p.open('[', "events", "want an array"); err != nil {
			return nil, err
		}
		for p.dec.More() {
			if len(events) == MaxEvents {
				return nil, ErrTooManyEvents
			}
			p.index = len(events)
			e, err := p.event(now)
			if err != nil {
				return nil, err
			}
			events = append(events, e)
		}
		p.index = -1
		if err := p.close(']'); err != nil {
			return nil, err
		}
	}
	if err := p.close('}'); err != nil {
		return nil, err
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	if len(events) == 0 {
		return nil, &FieldError{Index: -1, Field: "events", Reason: fmt.Sprintf("want 1-%d events", MaxEvents)}
	}
	return events, nil
}

// ParseEvent parses one event on its own (a Kafka record), judging its
// at_ms against now. The error is a *FieldError with Index -1.
func ParseEvent(record []byte, now time.Time) (Event, error) {
	if len(record) > MaxRecordBytes {
		return Event{}, &FieldError{Index: -1, Reason: fmt.Sprintf("event of %d bytes, want at most %d", len(record), MaxRecordBytes)}
	}
	p, err := newParser(record, -1)
	if err != nil {
		return Event{}, err
	}
	e, err := p.event(now)
	if err != nil {
		return Event{}, err
	}
	if err := p.end(); err != nil {
		return Event{}, err
	}
	return e, nil
}

// parser reads JSON token by token, which encoding/json's Unmarshal does
// not allow: it takes the last of duplicate keys, and reads a wrong type
// after the fact.
type parser struct {
	dec   *json.Decoder
	index int // the event being read, or -1
}

func newParser(b []byte, index int) (*parser, error) {
	if !utf8.Valid(b) {
		return nil, &FieldError{Index: index, Reason: "invalid UTF-8"}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return &parser{dec: dec, index: index}, nil
}

func (p *parser) fail(field, reason string) error {
	return &FieldError{Index: p.index, Field: field, Reason: reason}
}

// token reads the next token; a syntax error names field.
func (p *parser) token(field string) (json.Token, error) {
	t, err := p.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, p.fail(field, "invalid JSON: "+err.Error())
	}
	return t, nil
}

// open reads the delimiter d that opens a value of field.
func (p *parser) open(d json.Delim, field, want string) error {
	t, err := p.token(field)
	if err != nil {
		return err
	}
	if t != d {
		return p.fail(field, want)
	}
	return nil
}

// close reads the delimiter d, which More said comes next.
func (p *parser) close(d json.Delim) error {
	t, err := p.token("")
	if err != nil {
		return err
	}
	if t != d {
		return p.fail("", "invalid JSON")
	}
	return nil
}

// key reads an object's key, which More said comes next.
func (p *parser) key() (string, error) {
	t, err := p.token("")
	if err != nil {
		return "", err
	}
	k, ok := t.(string)
	if !ok {
		return "", p.fail("", "invalid JSON")
	}
	return k, nil
}

// end wants nothing after the value but whitespace.
func (p *parser) end() error {
	if _, err := p.dec.Token(); !errors.Is(err, io.EOF) {
		return &FieldError{Index: -1, Reason: "data after the JSON value"}
	}
	return nil
}

// str reads a string value of field.
func (p *parser) str(field string) (string, error) {
	t, err := p.token(field)
	if err != nil {
		return "", err
	}
	s, ok := t.(string)
	if !ok {
		return "", p.fail(field, "want a string")
	}
	return s, nil
}

// ms reads an integer value of field: whole, without exponent.
func (p *parser) ms(field string) (int64, error) {
	t, err := p.token(field)
	if err != nil {
		return 0, err
	}
	n, ok := t.(json.Number)
	if !ok {
		return 0, p.fail(field, "want an integer")
	}
	v, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return 0, p.fail(field, "want an integer of milliseconds")
	}
	return v, nil
}

// event reads one event object and checks it.
func (p *parser) event(now time.Time) (Event, error) {
	var e Event
	if err := p.open('{', "", "want a JSON object"); err != nil {
		return e, err
	}
	seen := map[string]bool{}
	for p.dec.More() {
		key, err := p.key()
		if err != nil {
			return e, err
		}
		if seen[key] {
			return e, p.fail(key, "given twice")
		}
		seen[key] = true
		if err := p.field(&e, key, now); err != nil {
			return e, err
		}
	}
	if err := p.close('}'); err != nil {
		return e, err
	}
	return e, p.check(e, seen)
}

// field reads the value of key into e, checking it on its own.
func (p *parser) field(e *Event, key string, now time.Time) error {
	var err error
	var s string
	switch key {
	case "uid":
		if e.UID, err = p.str(key); err == nil && !userid.Valid(e.UID) {
			return p.fail(key, "want 1-128 characters of [A-Za-z0-9._:@-]")
		}
	case "kind":
		s, err = p.str(key)
		e.Kind = Kind(s)
		if err == nil && e.Kind != Active && e.Kind != Turn && e.Kind != End {
			return p.fail(key, `want "active", "turn" or "end"`)
		}
	case "to":
		s, err = p.str(key)
		e.To = To(s)
		if err == nil && e.To != ToUser && e.To != ToUs {
			return p.fail(key, `want "user" or "us"`)
		}
	case "seg":
		if e.Seg, err = p.str(key); err == nil && !userid.ValidSegment(e.Seg) {
			return p.fail(key, "want 1-64 characters of [A-Za-z0-9._-]")
		}
	case "id":
		if e.ID, err = p.str(key); err == nil {
			if why := checkID(e.ID); why != "" {
				return p.fail(key, why)
			}
		}
	case "at_ms":
		if e.AtMS, err = p.ms(key); err == nil {
			if why := checkAtMS(e.AtMS, now); why != "" {
				return p.fail(key, why)
			}
		}
	case "max_ms":
		if e.MaxMS, err = p.ms(key); err == nil && (e.MaxMS < 1 || e.MaxMS > MaxHold.Milliseconds()) {
			return p.fail(key, fmt.Sprintf("%d, want 1-%d (1 ms to %v)", e.MaxMS, MaxHold.Milliseconds(), MaxHold))
		}
	default:
		return p.fail(key, "unknown field")
	}
	return err
}

// check applies the rules between fields, once every field was read.
func (p *parser) check(e Event, seen map[string]bool) error {
	switch {
	case !seen["uid"]:
		return p.fail("uid", "required")
	case !seen["kind"]:
		return p.fail("kind", "required")
	case e.Kind == Turn && !seen["to"]:
		return p.fail("to", `required with kind "turn"`)
	case e.Kind != Turn && seen["to"]:
		return p.fail("to", `only with kind "turn"`)
	case seen["max_ms"] && (e.Kind != Turn || e.To != ToUs):
		return p.fail("max_ms", `only with kind "turn" to "us"`)
	}
	return nil
}
