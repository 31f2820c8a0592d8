package promise

import (
	"testing"
	"time"
)

// handCase is one hand-made history and the verdicts it should get.
type handCase struct {
	name    string
	cfg     *Config // nil: cfg
	signals []Signal
	got     []Delivery
	faults  []Fault
	end     float64 // 0: 60 s
	want    string
}

// runCases checks each case's history and compares the verdicts, in the
// order Check gives them, with want.
func runCases(t *testing.T, cases []handCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.cfg != nil {
				c = *tc.cfg
			}
			end := at(60)
			if tc.end != 0 {
				end = at(tc.end)
			}
			vs := Check(c, History{Signals: tc.signals, Deliveries: tc.got, Faults: tc.faults, End: end})
			if got := render(vs); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
				for _, v := range vs {
					t.Logf("deadline %v stage %d: %s: %s (due %v, bound %v)", v.Deadline.Sub(t0), v.Stage, v.Class, v.Why, v.Due.Sub(t0), v.Bound.Sub(t0))
				}
			}
		})
	}
}

// The minute rule keys a later stage's window on when it really fell
// due: its delay after the stage before was detected, which lies
// anywhere between that stage's due time and its first delivery. An
// earlier silence's stage may so have taken any window in that stretch,
// and a later silence's same stage in such a window may rightly wait for
// its end. t0 is on a minute: the windows are [0, 60), [60, 120), ...
func TestMinuteWindowOfALaterStage(t *testing.T) {
	minute := &Config{Slack: time.Second, InFlight: 100 * time.Millisecond, Grace: 5 * time.Second, Match: 50 * time.Millisecond,
		Delays: []time.Duration{5 * time.Second}, Window: time.Minute}
	// The first silence's reminder (deadline 50) is held by a fault and
	// goes out at 57: its close falls due between 55 and 62, in the first
	// window or the second.
	held := []Fault{{Kind: "redis-pause", Start: at(49), End: at(52)}}
	first := []Delivery{guide("a", 1, 50, 57), guide("b", 2, 50, 62.2)}
	runCases(t, []handCase{
		// The service keyed the first close on 62, its real due time
		// (detected at 57): the second silence's close (due 80, the
		// same window) waits for the window's end, 120, and the user is
		// back at 90 before it goes. Not delivered is right.
		{name: "a close deferred behind an earlier close that may have taken its window is not lost", cfg: minute,
			signals: []Signal{ping(40, Answered), ping(65, Answered), ping(90, Answered)}, faults: held,
			got: append(first, guide("c", 1, 75, 75.2)), end: 99, want: "1:ok 2:ok 1:ok 2:ok"},
		// The same, the user away until 130: the window's end has passed,
		// the close never came. Lost.
		{name: "a close never delivered past the window's end is lost", cfg: minute,
			signals: []Signal{ping(40, Answered), ping(65, Answered), ping(130, Answered)}, faults: held,
			got: append(first, guide("c", 1, 75, 75.2)), end: 139, want: "1:ok 2:ok 1:ok 2:lost"},
		// The first reminder went out at once: its close fell due between
		// 55 and 55.2, in the first window, and no close of this user
		// took the second. The second close was owed by 81: lost.
		{name: "a close whose window no earlier close could have taken is lost", cfg: minute,
			signals: []Signal{ping(40, Answered), ping(65, Answered), ping(90, Answered)},
			got:     []Delivery{guide("a", 1, 50, 50.2), guide("b", 2, 50, 55.3), guide("c", 1, 75, 75.2)}, end: 99,
			want: "1:ok 2:ok 1:ok 2:lost"},
	})
}

// A ping without an answer, held in a frozen gateway, lands when it
// resumes and moves the deadline of the silence after the one it was
// sent in. A guide naming that deadline is of the later silence: a
// deadline at or after the one the signal ending the earlier silence
// granted was lapsed only after that signal landed.
func TestGuideOfTheNextSilence(t *testing.T) {
	// Deadline 10; a ping at 7 gets no answer (the gateway is frozen
	// from 6 to 12; had it landed at once, deadline 17); the user's ping
	// at 9.95 races the deadline (deadline 19.95). The ping at 7 lands
	// at 12: deadline 22.
	frozen := []Fault{{Kind: "sigstop gateway", Start: at(6), End: at(12)}}
	signals := []Signal{ping(0, Answered), ping(7, NoAnswer), ping(9.95, Answered)}
	runCases(t, []handCase{
		// The user is silent until 35 and is guided at 22.2 and 27.3 for
		// deadline 22: the second silence's guides, both on time. The
		// first silence was raced: not guided is right.
		{name: "a guide naming a deadline past the next silence's is that silence's",
			signals: append(signals[:3:3], ping(35, Answered)), faults: frozen,
			got: []Delivery{guide("a", 1, 22, 22.2), guide("b", 2, 22, 27.3)}, end: 44, want: "1:ok 1:ok 2:ok"},
		// The same guide, first tried after the user was back (an
		// answered ping at 21): false, whichever silence it is of.
		{name: "that guide to a user who was back is false",
			signals: append(signals[:3:3], ping(21, Answered)), faults: frozen,
			got: []Delivery{guide("a", 1, 22, 22.2)}, end: 30, want: "1:ok 1:false"},
		// No signal without an answer could have set deadline 22, and the
		// user was there at 22.2 (pinging at 21): a guide of no silence,
		// false.
		{name: "a guide naming a deadline no signal set is false",
			signals: []Signal{ping(0, Answered), ping(9.95, Answered), ping(21, Answered)},
			got:     []Delivery{guide("a", 1, 22, 22.2)}, end: 30, want: "1:ok 1:lost 1:false"},
	})
}

// TestGuideOfASilenceWhoseDeadlineWasLost: a turn to the user at 0 sets
// deadline 17; an answered ping at 1 would set 11, which does not move
// it. A Redis master restarted without its data between them, so the
// service knows only the ping's 11, and guides the silence naming it. A
// guide delivered after 17, while the user is silent, is that silence's
// guide; one delivered before 17 came while the user's deadline had not
// passed, and is false; one delivered after the user came back is of no
// silence, and false.
func TestGuideOfASilenceWhoseDeadlineWasLost(t *testing.T) {
	signals := []Signal{turn(TurnToUser, 0, 17), ping(1, Answered)}
	runCases(t, []handCase{
		{name: "delivered after the silence's own deadline",
			signals: signals, got: []Delivery{guide("a", 1, 11, 17.3), guide("b", 2, 11, 22.4)}, end: 30, want: "1:ok 2:ok"},
		{name: "delivered before it",
			signals: signals, got: []Delivery{guide("a", 1, 11, 12)}, end: 30, want: "1:false 2:lost"},
		{name: "delivered after the user came back",
			signals: append(signals[:2:2], ping(18, Answered)), got: []Delivery{guide("a", 1, 11, 18.5)}, end: 30,
			want: "1:ok 1:lost 1:false"},
		{name: "naming a deadline before the signal that set the silence's",
			signals: []Signal{ping(0, Answered), turn(TurnToUser, 12, 29)}, got: []Delivery{guide("a", 1, 11, 29.5)}, end: 40,
			want: "1:lost 1:lost 1:false"},
	})
}
