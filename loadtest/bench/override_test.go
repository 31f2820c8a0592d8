package main

import (
	"testing"
	"time"
)

// TestConnOverride: step 1's flags set what they name, leave the rest of
// the scale as it is, give the pings time to start before the window, and
// say themselves in the step's command.
func TestConnOverride(t *testing.T) {
	base := scaleFor(false).conns
	for _, tc := range []struct {
		name  string
		o     connOverride
		flags string
		check func(connScale) bool
	}{
		{"none", connOverride{}, "", func(sc connScale) bool { return sc == base }},
		{"250k", connOverride{conns: 250000, gateways: 15, loaders: 14, every: 30 * time.Second, ramp: 1000},
			" -conns 250000 -gateways 15 -wsloads 14 -ramp 1000 -ping-every 30s",
			func(sc connScale) bool {
				return sc.Conns == 250000 && sc.Gateways == 15 && sc.Loaders == 14 && sc.Ramp == 1000 &&
					sc.Every == 30*time.Second && sc.Settle > sc.Every && sc.Window == base.Window && sc.Procs == base.Procs
			}},
		{"conns alone", connOverride{conns: 5000}, " -conns 5000",
			func(sc connScale) bool {
				return sc.Conns == 5000 && sc.Gateways == base.Gateways && sc.Every == base.Every
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := base
			if flags := tc.o.apply(&sc); flags != tc.flags {
				t.Errorf("flags %q, want %q", flags, tc.flags)
			}
			if !tc.check(sc) {
				t.Errorf("scale %+v", sc)
			}
		})
	}
}
