package devstack

import (
	"slices"
	"testing"

	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeoutevent"
)

// TestOutageNotifies: a notify stage has every guarantee of a guide. With
// a policy whose only stage notifies the platform, Redis killed for twice
// the TTL and restarted from its AOF, and every gateway killed, the
// platform is told exactly once of each user who went silent, never of
// one who kept pinging, and each as the last stage, reason notify (the
// checks of TestOutageGuides, at the webhook the notifies go to).
func TestOutageNotifies(t *testing.T) {
	if testing.Short() {
		t.Skip("fault tests")
	}
	t.Parallel()
	notifyOnly := &policy.Policy{
		DefaultTTL: faultTTL,
		Jitter:     faultJitter,
		SegmentStages: map[string][]policy.Stage{
			"default": {{Action: timeoutevent.ActionNotify}},
		},
	}
	for _, name := range []string{"redis-killed-restarted-from-aof", "every-gateway-killed"} {
		i := slices.IndexFunc(outageFaults, func(f outageFault) bool { return f.name == name })
		if i < 0 {
			t.Fatalf("no fault %q", name)
		}
		f := outageFaults[i]
		f.opts.Policy = notifyOnly
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := testOutage(t, f, outagePeriods(f)[0].period)
			for _, uid := range r.hook.Users() {
				for _, g := range r.hook.Guides(uid) {
					if g.Action != timeoutevent.ActionNotify || g.Text != "" || !g.Final || g.Reason != timeoutevent.ReasonNotify {
						t.Errorf("%s: the platform got %+v, want a notify, final, reason notify", uid, g)
					}
				}
			}
		})
	}
}
