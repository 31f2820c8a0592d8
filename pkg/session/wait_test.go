package session

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// eventually polls cond until it holds, and fails the test once within
// has passed without it. Tests wait on what they need this way, never on
// a fixed sleep that assumes a fast machine.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !waitFor(within, cond) {
		t.Fatalf("waited %v for %s", within, what)
	}
}

// waitFor is eventually for a caller with more to say when cond did not
// hold within: it reports whether it did.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // the poll interval
	}
	return true
}

// redisNow is Redis's clock, the one every TTL, deadline and interval
// here is measured by.
func redisNow(t testing.TB, rdb redis.Cmdable) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// redisPast waits until Redis's clock is past at, to the millisecond
// the scripts read it in: a TTL has run out, a due time has come, a
// lease is over. Real time must pass for those, and this waits for just
// that much of it, however busy the machine.
func redisPast(t testing.TB, rdb redis.Cmdable, at time.Time) {
	t.Helper()
	eventually(t, 10*time.Second+time.Until(at), "Redis's clock past "+at.Format("15:04:05.000"), func() bool {
		return redisNow(t, rdb).UnixMilli() > at.UnixMilli()
	})
}
