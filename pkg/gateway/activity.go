package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/outage"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/timeline"
	"github.com/stillthere/stillthere/pkg/userid"
)

// The activity flow: a chat platform's servers report what their users
// do (POST /v1/activity, package activity). In the order a batch takes it:
//
//  1. serveActivity: off (no activity-secret) answers 404; then the
//     method, the secret, the content type and the body cap; then the
//     batch is parsed, and one bad event refuses all of it (400).
//  2. storeEvent turns each into the store's event, with the TTL a ping
//     in its segment grants (grantTTL) and the segment's clock. An event
//     without a segment is of its user's current one, else the default
//     segment, which only the store knows as it applies the event: it
//     carries its jitter, and the store takes the segment's TTL and clock
//     from the policy's rules (policy.Policy.Rules), in the same script.
//  3. One ApplyActivity call applies the batch, in order, or fails
//     (503): some events may have applied (a cluster node out), none is
//     promised, and the platform sends the batch again.
//     Applying twice is harmless: each event applies only if it is newer
//     than the state it would change (by at_ms, else by the order in which
//     it reached Redis), so a batch applied once already is stale the
//     second time, event for event. An event without at_ms is stamped
//     when applied, so its second application moves its user's clock by
//     the retry's delay at most; a platform that cares sends at_ms.

// activityTimeout bounds a batch's work in Redis.
const activityTimeout = 10 * time.Second

// activityRetryAfter is the Retry-After of a 503.
const activityRetryAfter = time.Second

// activityStore is what the endpoint needs of the Redis model
// (session.Store). Its types mirror the store's field for field.
type activityStore interface {
	// ApplyActivity applies events in order, as instance; an event of no
	// TTL takes its segment's from rules.
	ApplyActivity(ctx context.Context, instance string, rules session.SegmentRules, events []activityEvent) (activityResult, error)
}

// The store's words for an event, a clock and a batch's counts.
type (
	activityEvent  = session.Activity
	activityResult = session.ActivityResult
	activityKind   = session.ActivityKind
)

const (
	activityActive   = session.ActivityActive
	activityTurnUser = session.ActivityTurnUser
	activityTurnUs   = session.ActivityTurnUs
	activityEnd      = session.ActivityEnd
)

// storeEvent is e as the store applies it under p. Of no segment, its
// TTL and clock are left to the store, which resolves the segment and
// takes them from p's rules, with the jitter drawn here: grantTTL's.
func storeEvent(e activity.Event, p policy.Policy) activityEvent {
	out := activityEvent{
		UID:     e.UID,
		Segment: e.Seg,
		Kind:    storeKind(e),
		At:      e.At(),
		MaxHold: e.MaxHoldFor(),
	}
	if e.Seg == "" {
		out.Jitter = grantJitter(p)
		return out
	}
	out.TTL, out.Clock = grantTTL(p, e.Seg), p.Clock(e.Seg)
	return out
}

// activityHandler serves POST /v1/activity.
type activityHandler struct {
	// secret is the bearer the endpoint wants; "" turns it off.
	secret string
	// store applies the batches; nil turns the endpoint off too.
	store    activityStore
	policy   func() policy.Policy
	instance string
	now      func() time.Time
	log      *outage.Log
	// timeline records the turns the events changed; nil records none.
	timeline *timeline.Recorder
}

// Where activity events come from, as the timeline says.
const (
	viaEndpoint = "endpoint"
	viaTopic    = "topic"
)

func (h *activityHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.secret == "" || h.store == nil {
		// Off: as if there were no such endpoint.
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		admin.WriteJSON(w, http.StatusMethodNotAllowed, activity.ErrorResponse{Error: "method " + r.Method + ", want POST"})
		return
	}
	// The push call's bearer rule, in constant time, with its own secret.
	if !push.Authorized(r, h.secret) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="activity"`)
		admin.WriteJSON(w, http.StatusUnauthorized, activity.ErrorResponse{Error: "missing or wrong activity credentials"})
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !isJSON(ct) {
		admin.WriteJSON(w, http.StatusUnsupportedMediaType, activity.ErrorResponse{Error: fmt.Sprintf("content type %q, want application/json", ct)})
		return
	}
	events, code, refusal := h.read(w, r)
	if code != http.StatusOK {
		metricActivityEvents.WithLabelValues("unknown", "refused").Inc()
		admin.WriteJSON(w, code, refusal)
		return
	}
	// Not cut short by the platform hanging up: a batch under way is
	// applied whole or not at all, and the platform's retry is stale.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), activityTimeout)
	defer cancel()
	res, err := h.apply(ctx, events, viaEndpoint)
	kind := batchKind(events)
	if err != nil {
		metricActivityEvents.WithLabelValues(kind, "failed").Add(float64(len(events)))
		h.log.Fail(fmt.Errorf("batch of %d events: %w", len(events), err))
		w.Header().Set("Retry-After", fmt.Sprint(int(activityRetryAfter/time.Second)))
		admin.WriteJSON(w, http.StatusServiceUnavailable, activity.ErrorResponse{Error: "activity store unavailable: some events may not be applied; retry the whole batch (applying an event twice is harmless)"})
		return
	}
	h.log.OK()
	metricActivityEvents.WithLabelValues(kind, "applied").Add(float64(res.Applied))
	metricActivityEvents.WithLabelValues(kind, "stale").Add(float64(res.Stale))
	admin.WriteJSON(w, http.StatusOK, activity.Response{Applied: res.Applied, Stale: res.Stale})
}

// read reads and parses the batch, or says how to refuse it.
func (h *activityHandler) read(w http.ResponseWriter, r *http.Request) ([]activity.Event, int, activity.ErrorResponse) {
	tooLarge := activity.ErrorResponse{Error: fmt.Sprintf("body past %d bytes; send at most %d events a batch", activity.MaxBodyBytes, activity.MaxEvents)}
	if r.ContentLength > activity.MaxBodyBytes {
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, activity.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, http.StatusRequestEntityTooLarge, tooLarge
		}
		return nil, http.StatusBadRequest, activity.ErrorResponse{Error: "read body: " + err.Error()}
	}
	events, err := activity.ParseBatch(body, h.now())
	if errors.Is(err, activity.ErrTooManyEvents) {
		return nil, http.StatusRequestEntityTooLarge, activity.ErrorResponse{Error: err.Error(), Field: "events"}
	}
	if fe, ok := errors.AsType[*activity.FieldError](err); ok {
		out := activity.ErrorResponse{Error: fe.Error(), Field: fe.Field}
		if fe.Index >= 0 {
			out.Index = &fe.Index
		}
		return nil, http.StatusBadRequest, out
	}
	if err != nil {
		return nil, http.StatusBadRequest, activity.ErrorResponse{Error: err.Error()}
	}
	return events, http.StatusOK, activity.ErrorResponse{}
}

// apply applies the events, in one call, and records the turns they
// changed (via says where they came from), in the segments the store
// resolved: also when some buckets failed, whose events did not apply.
func (h *activityHandler) apply(ctx context.Context, events []activity.Event, via string) (activityResult, error) {
	p := h.policy()
	return h.applyEvents(ctx, p.Rules(), storeEvents(events, p), via)
}

// storeEvents is events as the store applies them under p.
func storeEvents(events []activity.Event, p policy.Policy) []activityEvent {
	out := make([]activityEvent, len(events))
	for i, e := range events {
		out[i] = storeEvent(e, p)
	}
	return out
}

// applyEvents is apply of events made store events already, under rules.
func (h *activityHandler) applyEvents(ctx context.Context, rules session.SegmentRules, out []activityEvent, via string) (activityResult, error) {
	res, err := h.store.ApplyActivity(ctx, h.instance, rules, out)
	if h.timeline != nil {
		for _, i := range res.Turned {
			seg := cmp.Or(res.Segments[i], out[i].Segment, userid.DefaultSegment)
			if e, ok := turnEntry(out[i].Kind, seg, via); ok {
				h.timeline.Record(out[i].UID, e)
			}
		}
	}
	if err != nil {
		return activityResult{}, fmt.Errorf("apply: %w", err)
	}
	return res, nil
}

// applyRecords applies records of the activity topic (activityfeed.Apply),
// as prepareRecords and what it returns do.
func (h *activityHandler) applyRecords(ctx context.Context, recs []*kgo.Record) (map[int]string, error) {
	return h.prepareRecords(recs)(ctx)
}

// prepareRecords readies records of the activity topic for applying
// (activityfeed.Prepare): each is one event, keyed by its uid so that a
// user's events keep their order in one partition. A record that does
// not parse, or whose key is not its uid, is refused with the reason, for
// the dead-letter topic; the rest become the store's events, under the
// policy in force now, which the function returned applies in one call,
// as a batch of the endpoint is (and again, if the feed retries it).
func (h *activityHandler) prepareRecords(recs []*kgo.Record) func(context.Context) (map[int]string, error) {
	refused := map[int]string{}
	events := make([]activity.Event, 0, len(recs))
	now := h.now()
	for i, r := range recs {
		e, err := activity.ParseEvent(r.Value, now)
		switch {
		case err != nil:
			refused[i] = err.Error()
		case string(r.Key) != e.UID:
			refused[i] = fmt.Sprintf("record key %q is not the event's uid %q: a user's records must share a key, to keep their order", r.Key, e.UID)
		default:
			events = append(events, e)
		}
	}
	if len(refused) > 0 {
		metricActivityEvents.WithLabelValues("unknown", "refused").Add(float64(len(refused)))
	}
	kind := batchKind(events)
	p := h.policy()
	rules, out := p.Rules(), storeEvents(events, p)
	return func(ctx context.Context) (map[int]string, error) {
		if len(out) == 0 {
			return refused, nil
		}
		res, err := h.applyEvents(ctx, rules, out, viaTopic)
		if err != nil {
			metricActivityEvents.WithLabelValues(kind, "failed").Add(float64(len(out)))
			return nil, err
		}
		metricActivityEvents.WithLabelValues(kind, "applied").Add(float64(res.Applied))
		metricActivityEvents.WithLabelValues(kind, "stale").Add(float64(res.Stale))
		return refused, nil
	}
}

// batchKind is the kind label of a batch's counts: the store counts
// applied and stale events per batch, not per kind, so a batch of several
// kinds counts as "mixed".
func batchKind(events []activity.Event) string {
	kind := ""
	for _, e := range events {
		k := string(storeKind(e))
		if kind != "" && k != kind {
			return "mixed"
		}
		kind = k
	}
	return kind
}

// storeKind is e's kind in the store's words.
func storeKind(e activity.Event) activityKind {
	switch {
	case e.Kind == activity.Turn && e.To == activity.ToUs:
		return activityTurnUs
	case e.Kind == activity.Turn:
		return activityTurnUser
	}
	return activityKind(e.Kind)
}

// isJSON reports whether the Content-Type ct is JSON in UTF-8:
// application/json or application/*+json, with no charset but utf-8.
func isJSON(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
