package expiry

import (
	"slices"
	"testing"
	"time"
)

// TestBrakePaceReleases: the brake's releases are spaced by the gap in
// the order they fall due, and none is ever earlier than its verdict, nor
// than the first free slot.
func TestBrakePaceReleases(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tests := []struct {
		name     string
		next     time.Time
		releases []time.Time
		gap      time.Duration
		want     []time.Time
		wantNext time.Time
	}{
		{"unpaced: each at its own", ms(500), []time.Time{ms(0), ms(0), ms(1)}, 0,
			[]time.Time{ms(0), ms(0), ms(1)}, ms(500)},
		{"one block spread at the gap", time.Time{}, []time.Time{ms(0), ms(0), ms(0), ms(0)}, 10 * time.Millisecond,
			[]time.Time{ms(0), ms(10), ms(20), ms(30)}, ms(40)},
		{"sparse releases keep their own time", time.Time{}, []time.Time{ms(0), ms(100), ms(200)}, 10 * time.Millisecond,
			[]time.Time{ms(0), ms(100), ms(200)}, ms(210)},
		{"in the order they fall due, returned in the order given", time.Time{}, []time.Time{ms(30), ms(0), ms(5)}, 10 * time.Millisecond,
			[]time.Time{ms(30), ms(0), ms(10)}, ms(40)},
		{"a slot taken by an earlier batch comes first", ms(50), []time.Time{ms(0), ms(60)}, 10 * time.Millisecond,
			[]time.Time{ms(50), ms(60)}, ms(70)},
		{"a slot long past holds nothing back", ms(-1000), []time.Time{ms(0)}, 10 * time.Millisecond,
			[]time.Time{ms(0)}, ms(10)},
		{"a next far ahead (Redis's clock stepped back) holds back at most maxPaceAhead", ms(3_600_000), []time.Time{ms(0), ms(0)}, 10 * time.Millisecond,
			[]time.Time{ms(50_000), ms(50_010)}, ms(50_020)},
		{"nothing to pace", ms(50), nil, 10 * time.Millisecond, []time.Time{}, ms(50)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.releases)
			got, next := paceReleases(tt.next, tt.releases, tt.gap)
			if !slices.EqualFunc(got, tt.want, time.Time.Equal) || len(got) != len(tt.want) {
				t.Errorf("paced %v, want %v", got, tt.want)
			}
			if !next.Equal(tt.wantNext) {
				t.Errorf("next %v, want %v", next, tt.wantNext)
			}
			if !slices.EqualFunc(in, tt.releases, time.Time.Equal) {
				t.Error("the verdicts' releases were changed in place")
			}
			for i := range got {
				if got[i].Before(tt.releases[i]) {
					t.Errorf("release %d paced to %v, before its verdict's %v", i, got[i], tt.releases[i])
				}
			}
		})
	}
}

// TestBrakePaceHolds: the listener paces the brake's holds only, across
// batches, at MassExpiryReleaseRate.
func TestBrakePaceHolds(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000)
	l := &Listener{cfg: Config{MassExpiryReleaseRate: 100}} // a gap of 10ms
	hold := func(rule holdRule) *item {
		return &item{verdict: verdict{act: actHold, rule: rule, release: t0}}
	}
	produce := &item{verdict: verdict{act: actProduce}}
	first := []*item{hold(ruleBrake), hold(ruleMinute), produce, hold(ruleBrake)}
	l.paceHolds(first)
	second := []*item{hold(ruleBrake)}
	l.paceHolds(second)
	for _, c := range []struct {
		name string
		it   *item
		want time.Time
	}{
		{"first brake hold", first[0], t0},
		{"minute rule's hold", first[1], t0},
		{"second brake hold", first[3], t0.Add(10 * time.Millisecond)},
		{"next batch's brake hold", second[0], t0.Add(20 * time.Millisecond)},
		{"a produce", produce, time.Time{}},
	} {
		if got := c.it.verdict.release; !got.Equal(c.want) {
			t.Errorf("%s: release %v, want %v", c.name, got, c.want)
		}
	}
}
