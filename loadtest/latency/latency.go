// Package latency is a concurrent histogram of durations for the load
// generators: constant memory however many samples, about 1.6% relative
// error, and a text form that one process prints and another merges, so
// that percentiles over several load processes are those of all their
// samples together rather than an average of each one's.
package latency

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Values are whole microseconds. Below linear they have a bucket each;
// above, every power of two is cut into sub buckets, so a bucket is at
// most 1/sub of its values wide.
const (
	sub     = 64
	linear  = 2 * sub
	maxExp  = 32 // values from 2^(7+32) µs (about 6 days) on share the last bucket
	buckets = linear + maxExp*sub
)

// Histogram counts durations. Record may be called from any number of
// goroutines at once; the zero value is empty and ready.
type Histogram struct {
	counts [buckets]atomic.Uint64
}

// index is the bucket of v microseconds.
func index(v uint64) int {
	if v < linear {
		return int(v)
	}
	shift := bits.Len64(v) - bits.Len64(linear-1) // 1 for [128, 256)
	if shift > maxExp {
		return buckets - 1
	}
	return linear + (shift-1)*sub + int(v>>shift) - sub
}

// bounds are the least and the greatest value of bucket i, in µs.
func bounds(i int) (lo, hi uint64) {
	if i < linear {
		return uint64(i), uint64(i)
	}
	shift := (i-linear)/sub + 1
	lo = uint64((i-linear)%sub+sub) << shift
	return lo, lo + 1<<shift - 1
}

// Record counts one duration; a negative one counts as zero.
func (h *Histogram) Record(d time.Duration) {
	h.counts[index(uint64(max(d.Microseconds(), 0)))].Add(1)
}

// Count is the number of durations recorded.
func (h *Histogram) Count() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if n := o.counts[i].Load(); n > 0 {
			h.counts[i].Add(n)
		}
	}
}

// Quantile is the duration below which a share q (0 to 1) of the
// recorded ones fall: the greatest value of the bucket holding that rank,
// so never less than the true figure and at most 1/64 above it. It is 0
// for an empty histogram.
func (h *Histogram) Quantile(q float64) time.Duration {
	total := h.Count()
	if total == 0 {
		return 0
	}
	// The rank of the sample sought, from 1: ceil(q × total), at least 1.
	rank := uint64(q * float64(total))
	if float64(rank) < q*float64(total) {
		rank++
	}
	rank = min(max(rank, 1), total)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			_, hi := bounds(i)
			return time.Duration(hi) * time.Microsecond
		}
	}
	return 0 // counts grew under us; not reached with a quiet histogram
}

// String is the text form: bucket:count pairs of the buckets that hold
// any, in order, comma-separated; "" when empty. Parse reads it back.
func (h *Histogram) String() string {
	var b strings.Builder
	for i := range h.counts {
		if n := h.counts[i].Load(); n > 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(i))
			b.WriteByte(':')
			b.WriteString(strconv.FormatUint(n, 10))
		}
	}
	return b.String()
}

// Parse reads String's form into a new histogram.
func Parse(s string) (*Histogram, error) {
	h := &Histogram{}
	if s == "" {
		return h, nil
	}
	for _, pair := range strings.Split(s, ",") {
		is, ns, ok := strings.Cut(pair, ":")
		if !ok {
			return nil, fmt.Errorf("histogram: %q is not bucket:count", pair)
		}
		i, err := strconv.Atoi(is)
		if err != nil || i < 0 || i >= buckets {
			return nil, fmt.Errorf("histogram: bucket %q is not one of 0-%d", is, buckets-1)
		}
		n, err := strconv.ParseUint(ns, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("histogram: count %q: %w", ns, err)
		}
		h.counts[i].Add(n)
	}
	return h, nil
}
