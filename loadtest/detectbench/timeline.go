package main

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// timelineOff runs the listeners and consumers with timeline-off: the
// figure beside which the timeline's cost on guide latency is read.
var timelineOff bool

// TimelineCost is what the users' decision timelines hold in Redis.
type TimelineCost struct {
	Users       int     `json:"users"`   // timelines in Redis
	Entries     int64   `json:"entries"` // entries in all of them
	MaxEntries  int64   `json:"max_entries"`
	MemoryBytes int64   `json:"memory_bytes"` // MEMORY USAGE, summed
	Silences    int     `json:"silences"`     // silences the bench caused until then
	PerSilenceB float64 `json:"memory_per_silence_bytes"`
	EntriesPer  float64 `json:"entries_per_silence"`
}

// timelineCost measures the timelines in Redis after silences silences.
// Every key of the bench is its own, so a scan finds them all.
func timelineCost(ctx context.Context, rdb *redis.Client, silences int) *TimelineCost {
	c := &TimelineCost{Silences: silences}
	iter := rdb.Scan(ctx, 0, "*tl:*", 10000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if k := iter.Val(); strings.Contains(k, "}:tl:") {
			keys = append(keys, k)
		}
	}
	for start := 0; start < len(keys); start += 1000 {
		chunk := keys[start:min(start+1000, len(keys))]
		lens := make([]*redis.IntCmd, len(chunk))
		mems := make([]*redis.IntCmd, len(chunk))
		rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range chunk {
				lens[i] = p.LLen(ctx, k)
				mems[i] = p.MemoryUsage(ctx, k, 0)
			}
			return nil
		})
		for i := range chunk {
			n := lens[i].Val()
			c.Entries += n
			c.MaxEntries = max(c.MaxEntries, n)
			c.MemoryBytes += mems[i].Val()
		}
	}
	c.Users = len(keys)
	if silences > 0 {
		c.PerSilenceB = float64(c.MemoryBytes) / float64(silences)
		c.EntriesPer = float64(c.Entries) / float64(silences)
	}
	return c
}
