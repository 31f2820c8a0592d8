package expiry

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestAttackBrokenReplicaSpoolsAfterQuietSpell: two listener replicas, one
// of which cannot produce (its Kafka answers pings but refuses records).
// Timeouts come in waves with quiet spells between them, as at night. A
// healthy replica counts as producing only for about 2s after its last
// produce, so after a quiet spell the broken replica, finding no other
// producer, spools what it claimed. From then on its spool is not empty,
// so it no longer even tries Kafka (direct() is false), and since only a
// failed direct produce counts as a failure (the replayer's do not), its
// standby ends 5s later and it claims and spools its share of every wave
// after each quiet spell. Those guides wait in a spool no Kafka takes,
// until they are too old to send, while the other replica could have
// produced them all. The issue: "It spools only when no replica can
// produce."
//
// A regression test: it failed before the listener counted produce
// failures per timeout in its dedup key (a replica that fails one leaves
// it to another live replica), and passes since.
func TestAttackBrokenReplicaSpoolsAfterQuietSpell(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	stopA := h.start(h.config(ModeSweep))
	defer stopA()

	bad := startKafka(t)
	bad.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testTopic, Err: kerr.UnknownServerError, Count: -1})
	cfgB := h.config(ModeSweep)
	cfgB.Kafka.Brokers = bad.ListenAddrs()
	// Not in lockstep with A's sweeps: in production the replicas' sweep
	// phases are random, and either may be first to a deadline.
	cfgB.SweepInterval = 37 * time.Millisecond
	b, stopB := h.startListener(cfgB)
	defer stopB()

	want := map[string]grant{}
	for wave := range 3 {
		// A quiet spell. Real time must pass: A's last produce ages past
		// what counts as producing, as at night.
		time.Sleep(5 * time.Second)
		// Twenty users whose deadlines fall 40ms apart.
		for i := range 20 {
			uid := fmt.Sprintf("w%d-%02d", wave, i)
			want[uid] = h.renew(uid, "default", 300*time.Millisecond+time.Duration(i)*40*time.Millisecond)
		}
	}
	// Every silent user on the topic, then one sweep more; if some wait
	// in B's spool, the assertion below says so.
	eventually(waitLong, func() bool {
		got := byUID(h.events())
		for uid := range want {
			if len(got[uid]) == 0 {
				return false
			}
		}
		return true
	})
	h.sweptPast(h.redisNow())
	spooled := b.spool.Len()
	stopB()
	stopA()
	got := byUID(h.events())
	missing := 0
	for uid := range want {
		if len(got[uid]) == 0 {
			missing++
		}
	}
	if spooled != 0 || missing != 0 {
		t.Errorf("the replica that cannot produce spooled %d events; %d of %d silent users have no timeout on the topic, though the other replica could produce all along",
			spooled, missing, len(want))
	}
}
