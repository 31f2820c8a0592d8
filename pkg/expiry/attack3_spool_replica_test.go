// Review round 3. Package: pkg/expiry (file pkg/expiry/attack3_spool_replica_test.go).
// Run: go test -race -count=1 -run 'TestAttack3KafkaOutageTwoReplicasCloseBeforeReminder|TestAttack3CloseOvertakesSpooledReminderOnOtherReplica' -v ./pkg/expiry/
// Shows: a later stage waits while the reminder sits in *this* replica's spool, but another
// listener replica (empty spool) produces the close as soon as it is due, before the reminder is
// replayed: after a Kafka outage longer than the close delay with two replicas, the close reaches
// the topic before the reminder for every affected user.
// Seen failing (4 of 4 runs of each after the outage was lengthened to reach the replay's 5s backoff; one
// earlier run with a 3s outage, under parallel load, passed):
//   spooled reminders: replica A 0, replica B 40
//   DEFECT: for 40 of 40 users the close reached the topic before the reminder ([u13 u01 u14 ...]):
//   the consumer sends the close first (4000, the chat ends), and the reminder after it is stale
//   DEFECT: the topic holds the stages [2] of the victim's silence while its reminder waits in replica A's spool

package expiry

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestAttack3CloseOvertakesSpooledReminderOnOtherReplica: README, stages:
// "While Kafka is down and events queue in the spool, a later stage waits
// in the index, and follows its delay after the replay produced the stage
// before it." That holds for the replica whose spool holds the reminder
// (emit skips later stages while its own spool is not empty), not for the
// others: the settle left the close due in the shared index, its delay
// after the reminder was *found*, and a healthy replica produces it as
// soon as it is due, while the reminder still waits in the first
// replica's spool (its Kafka path still broken, or its pod down with the
// spool on its volume). The user's chat is closed without the reminder
// ever going out; when the spool replays, the reminder is stale (the
// close ended the session) and is never sent.
func TestAttack3CloseOvertakesSpooledReminderOnOtherReplica(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const closeAfter = 2 * time.Second
	h.savePolicy(policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"default": {
				{Action: timeoutevent.ActionRemind},
				{After: closeAfter, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
		},
	})
	// Replica A alone, while Kafka refuses its produces: with no other
	// replica alive it spools the reminder, as README says.
	cfgA := h.config(ModeSweep)
	a, stopA := h.startListener(cfgA)
	fault := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	h.renew("victim", "default", 300*time.Millisecond)
	waitFor(t, waitLong, "replica A to spool the reminder", func() bool { return a.spool.Len() >= 1 })
	// A stays out of reach of Kafka (here: its pod is gone, the spool
	// waits on its volume); Kafka itself is fine for everyone else.
	if n := a.spool.Len(); n != 1 {
		t.Fatalf("A's spool holds %d events, want the reminder", n)
	}
	stopA()
	fault.Remove()

	// Replica B, healthy, sweeps the same index. Real time must pass: the
	// close would be due its delay after the reminder was found, and B
	// must not produce it however long A stays away.
	h.start(h.config(ModeSweep))
	// B sweeps past when the close would be due, and on.
	h.sweptPast(h.redisNow().Add(closeAfter + 3*time.Second))

	var stages []int
	for _, ev := range h.events() {
		if ev.UID == "victim" {
			stages = append(stages, ev.Stage)
		}
	}
	if len(stages) > 0 && stages[0] != 1 {
		t.Fatalf("DEFECT: the topic holds the stages %v of the victim's silence while its reminder waits in replica A's spool: "+
			"a consumer closes the chat (4000, final) of a user who was never asked whether they are still there; "+
			"the reminder, replayed later, is stale (the close ended the session) and never sent", stages)
	}

	// A comes back with its spool: it replays the reminder, and the close
	// follows its delay after it.
	h.start(cfgA)
	got := h.recordsOf("victim", 2)
	if got[0].ev.Stage != 1 || got[1].ev.Stage != 2 || !got[1].ev.Final {
		t.Fatalf("after replica A returned: events %+v, want the reminder, then the close", got)
	}
	if gap := got[1].at.Sub(got[0].at); gap < closeAfter-100*time.Millisecond {
		t.Fatalf("the close reached the topic %v after the replayed reminder, want its delay of %v", gap, closeAfter)
	}
}

// TestAttack3KafkaOutageTwoReplicasCloseBeforeReminder is the same hole
// with no replica lost: a Kafka outage longer than the close delay, with
// two listener replicas running. Each spools the reminders it found (no
// healthy peer), and leaves the closes in the index while its own spool
// holds anything. When Kafka is back, the replica whose replay drains
// first sweeps at once and produces the closes that fell due during the
// outage, among them those whose reminders still wait in the other
// replica's spool: on the topic, and so at the consumer, the close
// comes first.
func TestAttack3KafkaOutageTwoReplicasCloseBeforeReminder(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const closeAfter = time.Second
	h.savePolicy(policy.Policy{
		DefaultTTL: 10 * time.Second,
		SegmentStages: map[string][]policy.Stage{
			"default": {
				{Action: timeoutevent.ActionRemind},
				{After: closeAfter, Action: timeoutevent.ActionClose, Text: "We closed this chat."},
			},
		},
	})
	a, _ := h.startListener(h.config(ModeSweep))
	b, _ := h.startListener(h.config(ModeSweep))
	fault := h.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.NotEnoughReplicas, Count: -1})
	const users = 40
	for i := range users {
		h.renew(fmt.Sprintf("u%02d", i), "default", time.Duration(200+10*i)*time.Millisecond)
	}
	waitFor(t, waitLong, "every reminder spooled", func() bool { return a.spool.Len()+b.spool.Len() >= users })
	t.Logf("spooled reminders: replica A %d, replica B %d", a.spool.Len(), b.spool.Len())
	// The outage outlasts the close delay, so every close is due by the
	// time Kafka is back; long enough, as any outage past a 3-minute close
	// delay is, for the replay's backoff to reach its 5s cap.
	// Real time must pass: the outage itself.
	time.Sleep(closeAfter + 7*time.Second)
	fault.Remove()
	waitFor(t, waitLong, "both stages of every user on the topic", func() bool { return h.produced() >= 2*users })

	first := map[string]int{}
	var overtaken []string
	for _, ev := range h.events() {
		if _, seen := first[ev.UID]; seen {
			continue
		}
		first[ev.UID] = ev.Stage
		if ev.Stage != 1 {
			overtaken = append(overtaken, ev.UID)
		}
	}
	if len(overtaken) > 0 {
		t.Fatalf("DEFECT: for %d of %d users the close reached the topic before the reminder (%v): "+
			"the consumer sends the close first (4000, the chat ends), and the reminder after it is stale", len(overtaken), users, overtaken)
	}
}
