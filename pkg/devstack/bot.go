package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/stillthere/stillthere/pkg/activity"
	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/token"
)

// The demo bot: the other side of the demo chat page, so that the page
// shows whose turn it is. The page posts the user's message to POST
// /demo/bot (the gateway serves it on its public listener beside the page,
// and only because the dev stack hands it the handler: see
// gateway.Config.DemoBot), with the user's token as its bearer. In the
// order a message takes it:
//
//  1. The token is verified as the gateway verifies it, with the stack's
//     token secret: the bot speaks for whoever holds a token of this
//     stack (the tests' users too), and for no one else.
//  2. A turn to us goes to the gateway's activity endpoint: the user
//     waits for us, and no silence of theirs counts. Its max_ms is the
//     thinking time plus botHoldSlack, so a bot that dies mid-thought
//     holds the user no longer than that.
//  3. The bot thinks (Options' think time: a few seconds in the dev stack,
//     longer than the TTL in the browser test).
//  4. It answers in the response to the post (a long poll): the page
//     waits for it anyway, and it carries no guide semantics, unlike the
//     push endpoint, whose frames the page would show as guides.
//  5. Then a turn to the user, stamped with the answer's time: the user's
//     clock runs from the answer.
//
// One message per user at a time: a second while the bot thinks is
// refused (409), as its answer would pass the turn back while the bot
// still owed one. The bot thinks whether or not the page still waits:
// a real bot answers a user who closed the tab, and the turn passes.

const (
	// botHoldSlack is how much longer than the thinking time a turn to us
	// holds the user at most.
	botHoldSlack = 30 * time.Second
	// botCallTimeout bounds each call to the activity endpoint.
	botCallTimeout = 5 * time.Second
	// botMaxBody bounds a message's request body, and botMaxText its text
	// in characters (the page's input takes as many).
	botMaxBody = 4 << 10
	botMaxText = 500
	// botMaxThinking bounds the users the bot answers at once.
	botMaxThinking = 1000
	// DefaultBotThink is how long the bot thinks unless
	// STILLTHERE_DEV_BOT_THINK says otherwise.
	DefaultBotThink = 5 * time.Second
	// maxBotThink bounds STILLTHERE_DEV_BOT_THINK: a browser's fetch waits
	// a few minutes at most.
	maxBotThink = 2 * time.Minute
)

// botMessage is the page's post, and botAnswer the bot's reply.
type (
	botMessage struct {
		Text string `json:"text"`
	}
	botAnswer struct {
		Text string `json:"text"`
		// AnsweredMS is when the bot answered, Unix ms: the turn to the
		// user it then sends carries it as its at_ms.
		AnsweredMS int64 `json:"answered_ms"`
		ThoughtMS  int64 `json:"thought_ms"`
	}
)

// bot serves POST /demo/bot. Its HTTP handlers run on the gateways'
// public listeners; Stop ends their thinking.
type bot struct {
	verifier *token.Verifier
	think    time.Duration
	secret   string // the activity endpoint's
	client   *http.Client
	log      *slog.Logger
	// activityURL is the activity endpoint's: set by Start once the
	// gateway listens, before it serves anything.
	activityURL string

	stopOnce sync.Once
	stopped  chan struct{} // closed by Stop

	mu       sync.Mutex
	thinking map[string]bool // users whose message the bot is answering
	seq      atomic.Uint64   // names the events, for the logs
}

func newBot(verifier *token.Verifier, activitySecret string, think time.Duration, log *slog.Logger) *bot {
	return &bot{
		verifier: verifier,
		think:    think,
		secret:   activitySecret,
		client:   &http.Client{Timeout: botCallTimeout},
		log:      log,
		stopped:  make(chan struct{}),
		thinking: map[string]bool{},
	}
}

// Stop ends the thinking of every message under way, which then gets a
// 503 and passes no turn (its max_ms ends the hold). Safe to call twice.
func (b *bot) Stop() { b.stopOnce.Do(func() { close(b.stopped) }) }

func (b *bot) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	claims, err := b.verifier.Verify(strings.TrimSpace(raw))
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="demo-bot"`)
		admin.WriteError(w, http.StatusUnauthorized, err.Error())
		return
	}
	text, err := readMessage(w, r)
	if err != nil {
		admin.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch b.claim(claims.UID) {
	case claimBusy:
		admin.WriteError(w, http.StatusConflict, "the bot is still answering your last message")
		return
	case claimFull:
		admin.WriteError(w, http.StatusServiceUnavailable, "the bot is answering too many users; try again")
		return
	}
	defer b.release(claims.UID)

	n := b.seq.Add(1)
	log := b.log.With("uid", claims.UID, "message", n)
	// Not cut short by the page going away: the turns are the bot's.
	ctx := context.WithoutCancel(r.Context())
	if err := b.send(ctx, turnUs(claims.UID, claims.Segment, time.Now(), b.think+botHoldSlack, n)); err != nil {
		log.Warn("demo bot: turn to us", "err", err)
		admin.WriteError(w, http.StatusBadGateway, "the bot could not take the turn: "+err.Error())
		return
	}
	t := time.NewTimer(b.think)
	defer t.Stop()
	select {
	case <-t.C:
	case <-b.stopped:
		admin.WriteError(w, http.StatusServiceUnavailable, "the dev stack is stopping")
		return
	}
	answered := time.Now()
	admin.WriteJSON(w, http.StatusOK, botAnswer{Text: reply(text, b.think), AnsweredMS: answered.UnixMilli(), ThoughtMS: b.think.Milliseconds()})
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	if err := b.send(ctx, turnUser(claims.UID, claims.Segment, answered, n)); err != nil {
		// The user stays held until the turn to us runs out (max_ms).
		log.Warn("demo bot: turn to the user; held until the turn's max_ms", "err", err)
	}
}

// claimOutcome is what claim found.
type claimOutcome int

const (
	claimed claimOutcome = iota
	claimBusy
	claimFull
)

// claim marks uid's message as under way, unless one is or the bot is
// answering botMaxThinking users already.
func (b *bot) claim(uid string) claimOutcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.thinking[uid]:
		return claimBusy
	case len(b.thinking) >= botMaxThinking:
		return claimFull
	}
	b.thinking[uid] = true
	return claimed
}

func (b *bot) release(uid string) {
	b.mu.Lock()
	delete(b.thinking, uid)
	b.mu.Unlock()
}

// readMessage reads the page's post: {"text": "..."}, 1 to botMaxText
// characters.
func readMessage(w http.ResponseWriter, r *http.Request) (string, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, botMaxBody))
	if err != nil {
		return "", fmt.Errorf("read body: %w", err)
	}
	var m botMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return "", fmt.Errorf("body: want {\"text\": \"...\"}: %w", err)
	}
	text := strings.TrimSpace(m.Text)
	if n := utf8.RuneCountInString(text); n == 0 || n > botMaxText || !utf8.ValidString(text) {
		return "", fmt.Errorf("text: %d characters, want 1-%d", n, botMaxText)
	}
	return text, nil
}

// reply is the bot's answer to text, after thinking for think.
func reply(text string, think time.Duration) string {
	quoted := text
	if utf8.RuneCountInString(quoted) > 60 {
		quoted = string([]rune(quoted)[:60]) + "..."
	}
	return fmt.Sprintf("I thought about %q for %v: it was our turn, so no clock ran. It is your turn now: stay silent, and stillthere asks whether you are still there about one session TTL from this answer.", quoted, think)
}

// turnUs is the event that the user waits for us since at, for maxHold at
// most; turnUser, that it is the user's turn since at.
func turnUs(uid, seg string, at time.Time, maxHold time.Duration, n uint64) activity.Event {
	return activity.Event{UID: uid, Kind: activity.Turn, To: activity.ToUs, Seg: seg, AtMS: at.UnixMilli(),
		MaxMS: maxHold.Milliseconds(), ID: fmt.Sprintf("demo-bot-%d-us", n)}
}

func turnUser(uid, seg string, at time.Time, n uint64) activity.Event {
	return activity.Event{UID: uid, Kind: activity.Turn, To: activity.ToUser, Seg: seg, AtMS: at.UnixMilli(),
		ID: fmt.Sprintf("demo-bot-%d-user", n)}
}

// send posts e to the activity endpoint, as a platform's server does.
func (b *bot) send(ctx context.Context, e activity.Event) error {
	body, err := json.Marshal(struct {
		Events []activity.Event `json:"events"`
	}{[]activity.Event{e}})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.activityURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+b.secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	var refusal activity.ErrorResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&refusal); err != nil || refusal.Error == "" {
		return fmt.Errorf("activity endpoint: %s", resp.Status)
	}
	return fmt.Errorf("activity endpoint: %s: %s", resp.Status, refusal.Error)
}

// botThink parses v, the setting name's value: how long the bot thinks.
func botThink(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > maxBotThink {
		return 0, fmt.Errorf("%s=%q: want a duration from 0 to %v", name, v, maxBotThink)
	}
	return d, nil
}
