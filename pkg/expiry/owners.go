package expiry

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"time"

	"github.com/stillthere/stillthere/pkg/session"
)

// Bucket ownership. Each listener replica finds on time only the buckets
// it owns (the prefetch path, prefetch.go); every replica's safety sweep
// still reads every bucket, now and then. The owners are decided by
// rendezvous hashing over the replicas that take work: each bucket goes to
// the replica whose hash with it is highest, so a replica that joins takes
// a share of every other's buckets and one that leaves hands its own to
// the rest, with no other bucket moving. Each replica decides from the
// control state it last read; while two replicas' views differ, a bucket
// may have two owners (the dedup claim keeps one event) or none for a
// moment (the overdue part of the next window read, and the safety sweep,
// find what fell due meanwhile).

// replicasAlive lists the other listener replicas that take work, by the
// control state c: those that marked within fresh and could produce then
// (see othersAlive).
func replicasAlive(self string, c session.Control, fresh time.Duration) []string {
	var out []string
	for id, r := range c.Listeners {
		if id != self && !r.Failing && c.Now.Sub(r.At) <= fresh {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// ownedBuckets decides which buckets self owns among others, the other
// replicas that take work. A replica that cannot produce owns none while
// another takes work (it is on standby), and all when none does, as it
// then sweeps today.
func ownedBuckets(self string, selfOK bool, others []string) (owned [session.Buckets]bool) {
	if !selfOK {
		if len(others) == 0 {
			for b := range owned {
				owned[b] = true
			}
		}
		return owned
	}
	for b := range owned {
		best, bestID := rendezvous(self, b), self
		for _, id := range others {
			if w := rendezvous(id, b); w > best || (w == best && id < bestID) {
				best, bestID = w, id
			}
		}
		owned[b] = bestID == self
	}
	return owned
}

// rendezvous is replica id's weight for bucket b: the same in every
// process and build.
func rendezvous(id string, b int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], uint64(b))
	h.Write(buf[:])
	return mix64(h.Sum64())
}

// mix64 is splitmix64's finalizer: FNV of inputs that differ in their last
// byte only differs little, and the highest weight must not follow the id.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
