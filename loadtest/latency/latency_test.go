package latency

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	// Every bucket's values map back to it, the buckets tile the values
	// without gaps, and none is wider than 1/64 of its least value
	// beyond the linear ones.
	var next uint64
	for i := range buckets {
		lo, hi := bounds(i)
		if lo != next {
			t.Fatalf("bucket %d starts at %d, want %d (the previous one's end + 1)", i, lo, next)
		}
		if index(lo) != i || index(hi) != i {
			t.Fatalf("bucket %d = [%d, %d], but index(%d) = %d, index(%d) = %d", i, lo, hi, lo, index(lo), hi, index(hi))
		}
		if i >= linear && float64(hi-lo+1) > float64(lo)/sub {
			t.Fatalf("bucket %d = [%d, %d] is wider than 1/%d of %d", i, lo, hi, sub, lo)
		}
		next = hi + 1
	}
	if got := index(1 << 62); got != buckets-1 {
		t.Errorf("index(2^62) = %d, want the last bucket %d", got, buckets-1)
	}
}

func TestQuantile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		// 3000 µs is in [2976, 3007], 32 µs wide: the top of it.
		{"one", []time.Duration{3 * time.Millisecond}, 0.999, 3007 * time.Microsecond},
		{"exact below 128 µs", []time.Duration{10 * time.Microsecond, 20 * time.Microsecond, 30 * time.Microsecond, 40 * time.Microsecond}, 0.5, 20 * time.Microsecond},
		{"p99 of 100", hundred(), 0.99, 99 * time.Microsecond},
		{"p100 of 100", hundred(), 1, 100 * time.Microsecond},
		{"p0 is the least", hundred(), 0, time.Microsecond},
		{"negative counts as zero", []time.Duration{-time.Second}, 0.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Histogram
			for _, v := range tc.values {
				h.Record(v)
			}
			if got := h.Quantile(tc.q); got != tc.want {
				t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func hundred() []time.Duration {
	var v []time.Duration
	for i := 1; i <= 100; i++ {
		v = append(v, time.Duration(i)*time.Microsecond)
	}
	return v
}

func TestQuantileWithinError(t *testing.T) {
	// Against the exact order statistic of random samples: never below,
	// at most 1/64 above.
	r := rand.New(rand.NewPCG(1, 2))
	var h Histogram
	var all []time.Duration
	for range 20000 {
		v := time.Duration(r.ExpFloat64()*2000) * time.Microsecond
		h.Record(v)
		all = append(all, v)
	}
	slices.Sort(all)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := all[int(q*float64(len(all))+0.999999)-1]
		got := h.Quantile(q)
		if got < exact || float64(got-exact) > float64(exact)/sub+float64(time.Microsecond) {
			t.Errorf("Quantile(%v) = %v, exact %v", q, got, exact)
		}
	}
}

func TestConcurrentRecord(t *testing.T) {
	var h Histogram
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				h.Record(time.Duration(g*1000+i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	if n := h.Count(); n != 8000 {
		t.Fatalf("Count = %d, want 8000", n)
	}
}

func TestStringParseMerge(t *testing.T) {
	var a, b Histogram
	for _, v := range []time.Duration{0, 5 * time.Microsecond, 2 * time.Millisecond, 2 * time.Millisecond, time.Minute} {
		a.Record(v)
	}
	b.Record(2 * time.Millisecond)
	got, err := Parse(a.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != a.String() {
		t.Fatalf("Parse(String) = %q, want %q", got.String(), a.String())
	}
	got.Merge(&b)
	if got.Count() != 6 {
		t.Fatalf("merged Count = %d, want 6", got.Count())
	}
	if q := got.Quantile(0.5); q != a.Quantile(0.5) {
		t.Errorf("merged median %v, want %v (2 ms among 6)", q, a.Quantile(0.5))
	}
	if e, err := Parse(""); err != nil || e.Count() != 0 {
		t.Errorf(`Parse("") = %v, %v; want empty`, e, err)
	}
	for _, bad := range []string{"x", "1", "1:", ":1", "-1:1", "99999:1", "1:-1", "1:1,", "1:1,,2:2"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) took it", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("1:2,300:4")
	f.Add("")
	f.Add("2175:18446744073709551615")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := Parse(s)
		if err != nil {
			return
		}
		// What it took prints back to a form that parses to the same.
		again, err := Parse(h.String())
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", s, h.String(), err)
		}
		if again.String() != h.String() {
			t.Fatalf("round trip %q -> %q", h.String(), again.String())
		}
	})
}
