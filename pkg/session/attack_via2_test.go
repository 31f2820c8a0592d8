package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAttackViaSettledWhileKeyLives: the one moment a session key lives
// while its index entry is due is a lapsed grant's: kept at a deadline
// already past, its key lives 1 ms. A settle of that last stage in that
// ms must find the key and leave the via entry (it removes only the
// entries of a session gone): the next grant of the same instance finds
// the via in the key's value and writes no HSET, and a shorter grant
// after it reads the granter from the value. One transaction runs, at
// one instant: the lapsed grant, the settle, a long grant of the same
// instance, and a shorter one of another that keeps the long one's
// deadline. After the long grant the hash must hold what the value says,
// and at the end the granter named must be what the previous release's
// scripts (which read the hash) name for the same calls on a keyspace of
// their own.
func TestAttackViaSettledWhileKeyLives(t *testing.T) {
	srv, ctx := newStore(t)
	rdb := srv.rdb
	renewArgs := func(s *Store, uid, inst string, ttl time.Duration, mode string) []any {
		return s.withNotes(uid, ttl.Milliseconds(), "vip", inst, mode, RenewedKeep.Milliseconds(), 0, string(ClockPresence),
			MaxTurnHold.Milliseconds())
	}
	type side struct {
		name  string
		s     *Store
		renew script[grantKeys]
	}
	var seen bool
	for try := 0; try < 10 && !seen; try++ {
		var sides []side
		for _, n := range []string{"n", "o"} {
			ks, err := NewKeyspace(fmt.Sprintf("%s%s%d", srv.ks.Prefix(), n, try))
			if err != nil {
				t.Fatal(err)
			}
			sides = append(sides, side{n, NewStore(rdb, ks), renewScript})
		}
		sides[1].renew = prevRenewScript
		const uid = "via-settled"
		b := Bucket(uid)
		var vias, sessions []string
		for _, sd := range sides {
			s := sd.s
			if err := sd.renew.Run(ctx, rdb, s.ks.grantKeys(uid), renewArgs(s, uid, "gw-a", 50*time.Millisecond, modeRenew)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// The 50 ms session keys gone by Redis's expiry, so their index
		// entries are due.
		eventually(t, 5*time.Second, "the sessions expired", func() bool {
			for _, sd := range sides {
				if rdb.Exists(ctx, sd.s.ks.SessionKey(uid)).Val() != 0 {
					return false
				}
			}
			return true
		})
		var kept []*redis.BoolCmd
		var mids []*redis.StringCmd
		for _, sd := range sides {
			s := sd.s
			due, err := rdb.ZScore(ctx, s.ks.IndexKey(b), uid).Result()
			if err != nil {
				t.Fatal(err)
			}
			_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				// A lapsed grant shorter than the due deadline keeps it: its
				// key lives 1 ms, its value "vip/gw-a".
				sd.renew.Eval(ctx, p, s.ks.grantKeys(uid), renewArgs(s, uid, "gw-a", -time.Second, modeLapsed)...)
				// The last stage settled in that ms.
				settleScript.Eval(ctx, p, entryKeys{bucketKeys: s.ks.bucketKeys(b), Sessions: []string{s.ks.SessionKey(uid)}},
					uid, int64(due), 0, "")
				kept = append(kept, p.HExists(ctx, s.ks.ViaKey(b), uid))
				// A long grant of the same instance, then a shorter one of
				// another that keeps its deadline.
				sd.renew.Eval(ctx, p, s.ks.grantKeys(uid), renewArgs(s, uid, "gw-a", time.Minute, modeRenew)...)
				mids = append(mids, p.HGet(ctx, s.ks.ViaKey(b), uid))
				sd.renew.Eval(ctx, p, s.ks.grantKeys(uid), renewArgs(s, uid, "gw-d", 2*time.Second, modeRenew)...)
				return nil
			})
			if err != nil && err != redis.Nil { // a via entry missing is said below
				t.Fatal(err)
			}
			vias = append(vias, rdb.HGet(ctx, s.ks.ViaKey(b), uid).Val())
			sessions = append(sessions, rdb.Get(ctx, s.ks.SessionKey(uid)).Val())
		}
		// The settle found the key alive on this release's side (it left the
		// via entry): the case this test is for. Otherwise try again.
		seen = kept[0].Val()
		if mids[0].Val() != "gw-a" || mids[1].Val() != "gw-a" {
			t.Errorf("try %d: after the long grant of gw-a the via hash holds %q, the previous release's %q; want gw-a", try, mids[0].Val(), mids[1].Val())
		}
		if vias[0] != "gw-a,gw-d" || vias[1] != vias[0] {
			t.Errorf("try %d: via %q, previous release's %q; want gw-a,gw-d on both", try, vias[0], vias[1])
		}
		if sessions[0] != "vip/"+vias[0] {
			t.Errorf("try %d: session value %q, via hash %q", try, sessions[0], vias[0])
		}
	}
	if !seen {
		t.Skip("the settle never ran in the lapsed key's ms")
	}
}
