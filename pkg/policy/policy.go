// Package policy is the per-segment session timeout policy: each
// segment's session TTL, its clock (when a silence counts), and the
// stages of a silence (a reminder at the deadline, later ones, perhaps a
// close). It lives in Redis, so operators
// change it once for every service without a restart; gateways (for the
// TTL) and expiry listeners (for the stages) poll it and pick a change up
// within seconds.
package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/userid"
)

// Bounds of a session TTL.
const (
	MinTTL = time.Second
	MaxTTL = 24 * time.Hour
)

// Policy maps a user's segment to their session TTL and the stages of
// their silences.
type Policy struct {
	// DefaultTTL applies to segments not listed.
	DefaultTTL time.Duration
	// Jitter is added to every grant, uniform in [0, Jitter).
	Jitter time.Duration
	// Segments override DefaultTTL by segment name.
	Segments map[string]time.Duration
	// SegmentStages are the stages of a silence by segment name. A
	// segment not listed has the default segment's (userid.DefaultSegment);
	// with those not listed either, one reminder at the deadline with the
	// consumer's text. See Stages.
	SegmentStages map[string][]Stage
	// Clocks are the segments' clocks by segment name (see
	// session.Clock). A segment not listed has the default segment's;
	// with that not listed either, the presence clock. See Clock.
	Clocks map[string]session.Clock
}

// Clock is the clock of segment: its own, else the default segment's,
// else the presence clock.
func (p Policy) Clock(segment string) session.Clock {
	if c, ok := p.Clocks[segment]; ok && c != "" {
		return c
	}
	if c, ok := p.Clocks[userid.DefaultSegment]; ok && c != "" {
		return c
	}
	return session.ClockPresence
}

// TTL is the session TTL of segment, before jitter.
func (p Policy) TTL(segment string) time.Duration {
	if ttl, ok := p.Segments[segment]; ok {
		return ttl
	}
	return p.DefaultTTL
}

// Rules is the policy's TTL and clock by segment as the store resolves
// them for an activity event of no segment (session.SegmentRules): each
// segment with a TTL or a clock of its own, and for every other segment
// the default TTL and the default segment's clock. Rules().Of(s) is
// TTL(s) and Clock(s), for every s.
func (p Policy) Rules() session.SegmentRules {
	r := session.SegmentRules{Unlisted: session.SegmentRule{TTL: p.DefaultTTL, Clock: p.Clock(userid.DefaultSegment)}}
	if len(p.Segments)+len(p.Clocks) == 0 {
		return r
	}
	r.Segments = make(map[string]session.SegmentRule, len(p.Segments)+len(p.Clocks))
	for name := range p.Segments {
		r.Segments[name] = session.SegmentRule{TTL: p.TTL(name), Clock: p.Clock(name)}
	}
	for name := range p.Clocks {
		r.Segments[name] = session.SegmentRule{TTL: p.TTL(name), Clock: p.Clock(name)}
	}
	return r
}

// Validate names the first bad part of the policy.
func (p Policy) Validate() error {
	if err := checkTTL("default", p.DefaultTTL); err != nil {
		return err
	}
	shortest := p.DefaultTTL
	for _, name := range slices.Sorted(maps.Keys(p.Segments)) {
		if !userid.ValidSegment(name) {
			return fmt.Errorf("segment %q: want 1-64 characters of [A-Za-z0-9._-]", name)
		}
		if err := checkTTL("segment "+name, p.Segments[name]); err != nil {
			return err
		}
		shortest = min(shortest, p.Segments[name])
	}
	if p.Jitter < 0 || p.Jitter > shortest/2 {
		return fmt.Errorf("jitter %v: want between 0 and half the shortest TTL (%v)", p.Jitter, shortest/2)
	}
	for _, name := range slices.Sorted(maps.Keys(p.SegmentStages)) {
		if !userid.ValidSegment(name) {
			return fmt.Errorf("stages of segment %q: want a segment name of 1-64 characters of [A-Za-z0-9._-]", name)
		}
		if err := checkStages(name, p.SegmentStages[name]); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Clocks)) {
		if !userid.ValidSegment(name) {
			return fmt.Errorf("clock of segment %q: want a segment name of 1-64 characters of [A-Za-z0-9._-]", name)
		}
		if c := p.Clocks[name]; c == "" || !c.Valid() {
			return fmt.Errorf("clock of segment %s %q: want %s or %s", name, c, session.ClockPresence, session.ClockTurn)
		}
	}
	return nil
}

func checkTTL(what string, ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return fmt.Errorf("%s TTL %v: want between %v and %v", what, ttl, MinTTL, MaxTTL)
	}
	if ttl%time.Millisecond != 0 {
		return fmt.Errorf("%s TTL %v: want whole milliseconds", what, ttl)
	}
	return nil
}

// CheckGranularity names the first TTL of the policy under twice
// granularity, a gateway's renew-granularity: the least time it leaves
// between two renewals of one connection, answering pings in between from
// the last grant. A client pinging every p < granularity is renewed at the
// first ping at least a granularity after the last renewal, up to
// granularity + p after it; a TTL of twice the granularity covers that
// for every ping period shorter than the TTL, and a shorter one lapses a
// client pinging just faster than the granularity. The gateway's own
// session-ttl is held to the same bound.
func (p Policy) CheckGranularity(granularity time.Duration) error {
	check := func(what string, ttl time.Duration) error {
		if ttl < 2*granularity {
			return fmt.Errorf("%s TTL %v: below twice the gateway's renewal granularity %v (want at least %v), or a client pinging just faster than the granularity lapses",
				what, ttl, granularity, 2*granularity)
		}
		return nil
	}
	if err := check("default", p.DefaultTTL); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(p.Segments)) {
		if err := check("segment "+name, p.Segments[name]); err != nil {
			return err
		}
	}
	return nil
}

// String is the policy in one line, segments in name order, stage texts
// cut short.
func (p Policy) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "default=%v jitter=%v", p.DefaultTTL, p.Jitter)
	for _, name := range slices.Sorted(maps.Keys(p.Segments)) {
		fmt.Fprintf(&b, " %s=%v", name, p.Segments[name])
	}
	if len(p.SegmentStages) > 0 {
		b.WriteString("; stages")
		for _, name := range slices.Sorted(maps.Keys(p.SegmentStages)) {
			fmt.Fprintf(&b, " %s=%s", name, describe(p.SegmentStages[name]))
		}
	}
	if len(p.Clocks) > 0 {
		b.WriteString("; clocks")
		for _, name := range slices.Sorted(maps.Keys(p.Clocks)) {
			fmt.Fprintf(&b, " %s=%s", name, p.Clocks[name])
		}
	}
	return b.String()
}

// Equal reports whether p and q are the same policy, texts and all, as
// stored: an empty action is the same as "remind".
func (p Policy) Equal(q Policy) bool {
	a, errA := json.Marshal(p)
	b, errB := json.Marshal(q)
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// stored is the JSON form in Redis: durations as Go duration strings.
// Documents from before stages have no "stages" and still load: their
// segments have one reminder at the deadline, as they had then.
type stored struct {
	DefaultTTL string            `json:"default_ttl"`
	Jitter     string            `json:"jitter"`
	Segments   map[string]string `json:"segments,omitempty"`
	// Stages are decoded one by one (see decodeStages), so that an error
	// names the segment and stage.
	Stages map[string]json.RawMessage `json:"stages,omitempty"`
	// Clocks: documents from before clocks have none, and every segment
	// keeps the presence clock it had.
	Clocks map[string]session.Clock `json:"clocks,omitempty"`
}

// MarshalJSON encodes durations as strings such as "60s".
func (p Policy) MarshalJSON() ([]byte, error) {
	s := stored{DefaultTTL: p.DefaultTTL.String(), Jitter: p.Jitter.String(), Clocks: p.Clocks}
	if len(p.Clocks) == 0 {
		s.Clocks = nil
	}
	if len(p.Segments) > 0 {
		s.Segments = make(map[string]string, len(p.Segments))
		for k, v := range p.Segments {
			s.Segments[k] = v.String()
		}
	}
	if len(p.SegmentStages) > 0 {
		s.Stages = make(map[string]json.RawMessage, len(p.SegmentStages))
		for name, stages := range p.SegmentStages {
			b, err := json.Marshal(stages)
			if err != nil {
				return nil, err
			}
			s.Stages[name] = b
		}
	}
	return json.Marshal(s)
}

// UnmarshalJSON decodes and validates a policy.
func (p *Policy) UnmarshalJSON(b []byte) error {
	var s stored
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("decode policy: %w", err)
	}
	var out Policy
	var err error
	if out.DefaultTTL, err = time.ParseDuration(s.DefaultTTL); err != nil {
		return fmt.Errorf("default_ttl %q: %w", s.DefaultTTL, err)
	}
	if out.Jitter, err = time.ParseDuration(s.Jitter); err != nil {
		return fmt.Errorf("jitter %q: %w", s.Jitter, err)
	}
	for name, v := range s.Segments {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("segment %q TTL %q: %w", name, v, err)
		}
		if out.Segments == nil {
			out.Segments = map[string]time.Duration{}
		}
		out.Segments[name] = d
	}
	for _, name := range slices.Sorted(maps.Keys(s.Stages)) {
		stages, err := decodeStages(name, s.Stages[name])
		if err != nil {
			return err
		}
		if out.SegmentStages == nil {
			out.SegmentStages = map[string][]Stage{}
		}
		out.SegmentStages[name] = stages
	}
	if len(s.Clocks) > 0 {
		out.Clocks = s.Clocks
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*p = out
	return nil
}

// Store reads and writes the policy in Redis.
type Store struct {
	rdb redis.UniversalClient
	key string
}

// NewStore keeps the policy of keyspace ks.
func NewStore(rdb redis.UniversalClient, ks session.Keyspace) *Store {
	return &Store{rdb: rdb, key: ks.PolicyKey()}
}

// ErrNone means no policy was ever set: the services' configured TTL and
// jitter apply.
var ErrNone = errors.New("no timeout policy set")

// Load reads the policy.
func (s *Store) Load(ctx context.Context) (Policy, error) {
	b, err := s.rdb.Get(ctx, s.key).Bytes()
	if errors.Is(err, redis.Nil) {
		return Policy{}, ErrNone
	}
	if err != nil {
		return Policy{}, fmt.Errorf("load timeout policy: %w", err)
	}
	var p Policy
	if err := json.Unmarshal(b, &p); err != nil {
		return Policy{}, fmt.Errorf("timeout policy in %s: %w", s.key, err)
	}
	return p, nil
}

// Save validates and writes the policy.
func (s *Store) Save(ctx context.Context, p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := s.rdb.Set(ctx, s.key, b, 0).Err(); err != nil {
		return fmt.Errorf("save timeout policy: %w", err)
	}
	return nil
}
