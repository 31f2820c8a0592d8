package promise

import (
	"testing"
	"time"
)

// Attacks on the checker: hand-made histories it misclassified, each with
// what really happened and the class it should give. Times are seconds
// from t0, one user, a 10 s TTL, the package's cfg unless a case says.

// oneStage is cfg without a later stage: a case about stage 1 alone.
var oneStage = func() Config { c := cfg; c.Delays = nil; return c }()

func TestAttack(t *testing.T) {
	runCases(t, []handCase{
		// The user's ping raced the deadline (sent 9.95, answered at
		// once), so a guide at the deadline is right either way; but this
		// one was first tried at 12, two seconds after the user was known
		// back. Had the ping come at 10.5 instead, the checker calls the
		// same guide false; a return that came sooner cannot excuse more.
		// False.
		{name: "a guide long after a racing return is false", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(9.95, Answered)},
			got:     []Delivery{guide("a", 1, 10, 12)}, end: 19, want: "1:false"},

		// The user raced the deadline, and two guides with two ids
		// came for the one silence: one guide or none is right, two are
		// a duplicate whichever side the ping landed on. Duplicated.
		{name: "two guides for a raced silence are a duplicate", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(10.05, Answered)},
			got:     []Delivery{guide("a", 1, 10, 10.02), guide("b", 1, 10, 10.03)}, end: 20, want: "1:duplicated"},

		// Two guides with two ids for the one deadline 10, while a ping
		// at 5 had no answer. Had it landed, both are false (no silence
		// at 10); had it not, the second is a duplicate. A failure in
		// every world: duplicated, not indeterminate.
		{name: "doubt does not hide a duplicate", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(5, NoAnswer)},
			got:     []Delivery{guide("a", 1, 10, 10.2), guide("b", 1, 10, 10.3)}, want: "1:duplicated"},

		// A ping at 5 had no answer; the user was known back at 10.5 by
		// an answered ping, and the guide was first tried at 11. Had the
		// ping at 5 landed there was no silence at 10; had it not, the
		// guide went half a second after the user was known back.
		// False either way, not indeterminate.
		{name: "doubt does not excuse a guide after the user was known back", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(5, NoAnswer), ping(10.5, Answered)},
			got:     []Delivery{guide("a", 1, 10, 11)}, end: 20, want: "1:false"},

		// A ping at 5 had no answer, and the user was back at 14 with
		// no guide. Had it landed (deadline 15), no guide was owed; had
		// it not, a guide was owed by 11 and the user came back three
		// seconds past that bound: lost. Indeterminate, not ok.
		{name: "a possibly lost guide is not ok", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(5, NoAnswer), ping(14, Answered)},
			end:     23, want: "1:indeterminate"},

		// Redis was down from 8 to 20. The deadline 10 passed with the
		// user away, but they came back at 12 and kept pinging (12, 14,
		// 16: refused), so the guide the outage held back until 21
		// reached a user who had been trying to reach us for nine
		// seconds, whose last ping would have kept them until 26. Spam:
		// a silence we caused is not a silence. (Answered pings there
		// would make it false.)
		{name: "a guide held by a fault past the user's refused return is spam", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(12, Refused), ping(14, Refused), ping(16, Refused)},
			faults:  []Fault{{"redis-down", at(8), at(20), 0}},
			got:     []Delivery{guide("a", 1, 10, 21)}, want: "1:spam"},

		// One user on two devices on one gateway; at 5 both pinged and
		// the gateway died: two pings, no answer, sent together. That is
		// one try, not a user who kept trying through a fault: had one
		// landed the guide is false, had none it is right.
		// Indeterminate, not spam.
		{name: "two devices cut at once are one try, not spam", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(5, NoAnswer), ping(5.01, NoAnswer)},
			got:     []Delivery{guide("a", 1, 10, 10.2)}, want: "1:indeterminate"},

		// One false guide (its deadline was renewed at 5), fanned out to
		// the user's phone and laptop under one id: one guide, one
		// verdict. Two verdicts count one mistake twice in the table.
		{name: "one stray guide on two devices is one verdict", cfg: &oneStage,
			signals: []Signal{ping(0, Answered), ping(5, Answered)},
			got: []Delivery{guide("a", 1, 10, 10.1),
				{UID: "u", ID: "a", Stage: 1, Deadline: at(10), At: at(10.1), Sink: "laptop"}},
			end: 14, want: "1:false"},

		// Minute rule. The first silence (deadline 10) got no guide: the
		// user was back at 10.5, so the guide was found stale or never
		// produced, and the window holds no guide that went out. The
		// second silence in the window (deadline 20.5) is then produced
		// at once, not deferred to the window's end: a guide at 60.5 is
		// late.
		{name: "minute rule: a window whose first silence had no guide defers nothing",
			cfg:     &Config{Slack: time.Second, InFlight: 100 * time.Millisecond, Match: 50 * time.Millisecond, Window: time.Minute},
			signals: []Signal{ping(0, Answered), ping(10.5, Answered)},
			got:     []Delivery{guide("b", 1, 20.5, 60.5)}, end: 70, want: "1:ok 1:late"},
	})
}

// An unanswered turn to the user at 3 would have shortened the deadline
// from 30 to 13, and a guide naming 13 came at 13.2. Had the turn landed,
// that guide was right and nothing was owed at 30; had it not, the guide
// was false and one was owed at 30. Nothing here is known to have failed:
// no verdict may be a failure, and the silence at 30 is not lost.
func TestAttackShortenedByAnUnansweredTurn(t *testing.T) {
	signals := []Signal{
		{UID: "u", Kind: Ping, Sent: at(0), Outcome: Answered, Deadline: at(30)},
		{UID: "u", Kind: TurnToUser, Sent: at(3), Outcome: NoAnswer, Deadline: at(13)},
	}
	vs := Check(oneStage, History{Signals: signals, Deliveries: []Delivery{guide("a", 1, 13, 13.2)}, End: at(60)})
	for _, v := range vs {
		if v.Class.Failure() {
			t.Errorf("stage %d (deadline %v): %s: %s", v.Stage, v.Deadline.Sub(t0), v.Class, v.Why)
		}
	}
}
