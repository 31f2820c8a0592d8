// Package session is the Redis model of a chat session.
//
// A session is a key with a TTL that the gateway renews on every app-level
// ping. Beside it, each of a fixed number of buckets holds a deadline index
// (a sorted set of uid by deadline in ms, from Redis's clock) and the
// sessions' segments, so that the expiry listener can find due sessions by
// sweeping instead of trusting Redis's late and lossy expired events.
//
// Every key of a bucket carries the bucket's hash tag, so a session's keys
// share one Redis Cluster slot and the buckets spread over the masters.
//
//	<prefix>:{b07}:s:<uid>         session key, TTL = deadline: the segment, and the via the via hash holds (sessionFormat)
//	<prefix>:{b07}:dl              deadline index: ZSET uid -> deadline ms
//	<prefix>:{b07}:seg             segments: HASH uid -> segment
//	<prefix>:{b07}:via             gateway instance of the last renewal: HASH uid -> via (viaFormat)
//	<prefix>:{b07}:hold            timeouts held for a recheck: ZSET uid -> release ms
//	<prefix>:{b07}:held            deadline a timeout was held for: HASH uid -> deadline ms
//	<prefix>:{b07}:stage           stage an entry is due for, past the first: HASH uid -> stageFormat
//	<prefix>:{b07}:rn:<uid>        when uid last renewed or ended its session, ms (Redis clock)
//	<prefix>:{b07}:tn:<uid>        whose turn it is in uid's conversation, since when, held until when (turnFormat)
//	<prefix>:{b07}:dd:<uid>:<n>    expiry listener's dedup key, n = deadline minute (dedupFormat)
//	<prefix>:{b07}:pg:<uid>/<id>   push claim and outcome of guide id for uid (pushFormat)
//	<prefix>:{b07}:pg:<id>         guide id delivered, as gateways before uid scoping wrote it (read only)
//	<prefix>:{b07}:rt:<uid>        gateway instances holding uid's connections: HASH instance -> count
//	<prefix>:{b07}:rs:<uid>        when each of them last wrote its count there: HASH instance -> ms
//	<prefix>:{b07}:in:<uid>        guides waiting for uid's next connect: LIST of JSON
//	<prefix>:{b07}:in:<uid>/lease  inbox guides being handed over: HASH id -> until ms
//	<prefix>:{b07}:in:<uid>/settled guides settled (proven received, superseded, stale): HASH id -> until ms
//	<prefix>:gw:<instance>         Pub/Sub channel of one gateway instance
//	<prefix>:policy                the segments' policy, JSON (package policy)
//	<prefix>:{ctl}:alive           gateway heartbeats: HASH instance -> aliveFormat
//	<prefix>:{ctl}:blind           blind intervals: ZSET blindFormat -> end ms
//	<prefix>:{ctl}:swept           Redis time of the last complete sweep, ms
//	<prefix>:{ctl}:runid           run id of the Redis holding {ctl} (/cluster epoch), at the last sweep
//	<prefix>:{ctl}:roles           the cluster nodes' roles, at the last sweep
//	<prefix>:{ctl}:lapses:<s>      timeouts claimed in second s (mass-expiry brake)
//	<prefix>:{ctl}:listeners       listener replicas: HASH id -> listenerFormat
//
// This is the one table of the model's keys: every key is named by a
// method of Keyspace below, and every script's keys by a key list type
// (see scripts.go).
//
// The {ctl} keys share one slot, so the scripts that read one and write
// another are atomic on Redis Cluster too.
//
// The model is in this package alone: the keys (this file), the Lua
// scripts (lua/, loaded by scripts.go, each with its key list type in
// keylists.go), and the layouts of the stored values Go and Lua both
// read (values.go). The gateway, the listener and the consumer reach
// Redis's scripts only through its methods.
package session

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/stillthere/stillthere/pkg/userid"
)

// Buckets is the number of deadline-index buckets. Every gateway and
// listener must agree on it, so it is a constant, not a setting.
const Buckets = 64

// DefaultSegment is the segment of a session whose token names none.
const DefaultSegment = userid.DefaultSegment

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,32}$`)

// Keyspace names the keys of one deployment. The prefix keeps deployments
// (and tests) that share a Redis apart.
type Keyspace struct {
	prefix string
}

// NewKeyspace checks the prefix: 1-32 characters of [A-Za-z0-9._-], so it
// can never contain a hash tag brace or the ':' separator.
func NewKeyspace(prefix string) (Keyspace, error) {
	if !prefixRE.MatchString(prefix) {
		return Keyspace{}, fmt.Errorf("key prefix %q: want 1-32 characters of [A-Za-z0-9._-]", prefix)
	}
	return Keyspace{prefix: prefix}, nil
}

// Prefix is the deployment's key prefix.
func (k Keyspace) Prefix() string { return k.prefix }

// Bucket is the deadline-index bucket of uid.
func Bucket(uid string) int {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return int(h.Sum32() % Buckets)
}

func (k Keyspace) bucketPrefix(b int) string {
	return k.prefix + ":{b" + strconv.Itoa(b) + "}:"
}

// SessionKeyPrefix is what every session key of bucket b starts with.
func (k Keyspace) SessionKeyPrefix(b int) string { return k.bucketPrefix(b) + "s:" }

// SessionKey is the TTL'd key of uid's session.
func (k Keyspace) SessionKey(uid string) string { return k.SessionKeyPrefix(Bucket(uid)) + uid }

// IndexKey is bucket b's deadline index.
func (k Keyspace) IndexKey(b int) string { return k.bucketPrefix(b) + "dl" }

// SegmentsKey is bucket b's hash of uid to segment.
func (k Keyspace) SegmentsKey(b int) string { return k.bucketPrefix(b) + "seg" }

// ViaKey is bucket b's hash of uid to the gateway instance that last
// renewed its session.
func (k Keyspace) ViaKey(b int) string { return k.bucketPrefix(b) + "via" }

// HoldKey is bucket b's set of timeouts held for a recheck, by release time.
func (k Keyspace) HoldKey(b int) string { return k.bucketPrefix(b) + "hold" }

// HeldKey is bucket b's hash of uid to the deadline its timeout was held
// for. It outlives the release, so a recheck is known as one.
func (k Keyspace) HeldKey(b int) string { return k.bucketPrefix(b) + "held" }

// StageKey is bucket b's hash of uid to the stage its index entry is due
// for, past the first, as "<stage>:<deadline ms>": the entry's score is
// then that stage's due time, and the deadline is the silence's. A uid
// without one is due for stage 1 at its score, its deadline.
func (k Keyspace) StageKey(b int) string { return k.bucketPrefix(b) + "stage" }

// bucketKeys are the keys every session script of bucket b declares.
func (k Keyspace) bucketKeys(b int) bucketKeys {
	return bucketKeys{Index: k.IndexKey(b), Segments: k.SegmentsKey(b), Via: k.ViaKey(b),
		Hold: k.HoldKey(b), Held: k.HeldKey(b), Stage: k.StageKey(b)}
}

// RenewedKey holds when uid last renewed its session, or ended it, by
// Redis's clock: a guide whose deadline is older is for a silence that is
// over. It outlives the session by RenewedKeep.
func (k Keyspace) RenewedKey(uid string) string { return k.bucketPrefix(Bucket(uid)) + "rn:" + uid }

// TurnKey holds whose turn it is in uid's conversation (turnFormat):
// the user's, or ours until a time; or the turn clock's park waiting for
// the first turn to the user, or the platform's end. It lives as long as the session's
// keys do, the session's deadline plus RenewedKeep, refreshed with every
// renewal. The platform's end leaves it "ended" for RenewedKeep, which
// an event older than the end cannot pass; End (a chat window closed,
// not the conversation) leaves it as it is.
func (k Keyspace) TurnKey(uid string) string { return k.bucketPrefix(Bucket(uid)) + "tn:" + uid }

// RenewedKeep is how long a renewal is remembered past its session: longer
// than any guide for an earlier deadline can still go out (the consumer's
// max age, the inbox's, an outage hold).
const RenewedKeep = 2 * time.Hour

// sessionKeys are the keys of uid's session scripts.
func (k Keyspace) sessionKeys(uid string) sessionKeys {
	return sessionKeys{Session: k.SessionKey(uid), bucketKeys: k.bucketKeys(Bucket(uid)), Renewed: k.RenewedKey(uid),
		Turn: k.TurnKey(uid)}
}

// grantKeys are the keys of uid's renewals and ends.
func (k Keyspace) grantKeys(uid string) grantKeys {
	return grantKeys{sessionKeys: k.sessionKeys(uid), Timeline: k.TimelineKey(uid), Route: k.RouteKey(uid)}
}

func (k Keyspace) controlKey(name string) string { return k.prefix + ":{ctl}:" + name }

// AliveKey holds the gateway instances' heartbeats.
func (k Keyspace) AliveKey() string { return k.controlKey("alive") }

// BlindKey holds the intervals in which users could not reach us.
func (k Keyspace) BlindKey() string { return k.controlKey("blind") }

// SweptKey holds Redis's time at the last complete sweep.
func (k Keyspace) SweptKey() string { return k.controlKey("swept") }

// RunIDKey holds the run id of the Redis that holds the control keys, and
// on a cluster the cluster's epoch, as the last sweep saw them. A listener
// of a release before RolesKey takes any other change of it for a
// failover, so this one writes it as that one does: while both run (a
// rolling upgrade), neither sees a failover in the other's marks.
func (k Keyspace) RunIDKey() string { return k.controlKey("runid") }

// RolesKey holds which nodes of the cluster are masters serving slots and
// which replicas, as the last sweep saw them (see clusterRolesLua).
func (k Keyspace) RolesKey() string { return k.controlKey("roles") }

// LapsesKey counts the timeouts claimed in one second (Unix seconds).
func (k Keyspace) LapsesKey(sec int64) string {
	return k.controlKey("lapses:" + strconv.FormatInt(sec, 10))
}

// LapsesTokenKey marks a count of lapses as added (Store.Lapses).
func (k Keyspace) LapsesTokenKey(token string) string {
	return k.controlKey("lapses-token:" + token)
}

// ListenersKey holds when each listener replica last marked a sweep.
func (k Keyspace) ListenersKey() string { return k.controlKey("listeners") }

// ActivityKey is the activity feed's watermark: a hash from each partition
// of the activity topic to the time, by Redis's clock, before which every
// record of it had been applied.
func (k Keyspace) ActivityKey() string { return k.controlKey("activity") }

// DedupKey marks that uid's timeout in the given minute window was produced.
func (k Keyspace) DedupKey(uid string, window int64) string {
	return k.bucketPrefix(Bucket(uid)) + "dd:" + uid + ":" + strconv.FormatInt(window, 10)
}

// StageDedupKey is the dedup key of uid's timeouts at stage that were due
// in the minute window of due: stage 1's is DedupKey of its deadline, and
// the stages of one silence are not each other's duplicates.
func (k Keyspace) StageDedupKey(uid string, stage int, due time.Time) string {
	key := k.DedupKey(uid, DedupWindow(due))
	if stage > 1 {
		key += ":s" + strconv.Itoa(stage)
	}
	return key
}

// ErrNotSession means a key is not one of this keyspace's session keys.
var ErrNotSession = errors.New("not a session key")

// ParseSessionKey returns the uid of a session key, as found in an expired
// keyspace event. It rejects keys of other prefixes, keys whose bucket tag
// does not match the uid, and uids the contract does not allow.
func (k Keyspace) ParseSessionKey(key string) (string, error) {
	rest, ok := strings.CutPrefix(key, k.prefix+":{b")
	if !ok {
		return "", ErrNotSession
	}
	num, rest, ok := strings.Cut(rest, "}:s:")
	if !ok || num == "" || len(num) > 2 || (len(num) > 1 && num[0] == '0') ||
		strings.Trim(num, "0123456789") != "" {
		return "", ErrNotSession
	}
	b, err := strconv.Atoi(num)
	if err != nil || b >= Buckets {
		return "", ErrNotSession
	}
	if !userid.Valid(rest) || Bucket(rest) != b {
		return "", ErrNotSession
	}
	return rest, nil
}

// DeliveredKey holds the push state of guide id for uid: claimed while a
// push of it runs, then its outcome (pushFormat). It is scoped by uid,
// which cannot contain '/', so two users never share a guide id's state.
func (k Keyspace) DeliveredKey(uid, id string) string {
	return k.bucketPrefix(Bucket(uid)) + "pg:" + uid + "/" + id
}

// CloseKey holds whether the close stage's guide id for uid was applied
// or cancelled, as the first connection about to write it found (see
// Store.CommitClose).
func (k Keyspace) CloseKey(uid, id string) string {
	return k.bucketPrefix(Bucket(uid)) + "pc:" + uid + "/" + id
}

// CloseAtKey holds when the close stage's guide id for uid was decided
// applied, Unix ms by Redis's clock, beside CloseKey: the moment the chat
// closed, which says whether a connection was there then (see
// Store.CloseAppliedAt). Absent for a close decided by a gateway before
// it.
func (k Keyspace) CloseAtKey(uid, id string) string {
	return k.bucketPrefix(Bucket(uid)) + "pca:" + uid + "/" + id
}

// PushedKey is where gateways before DeliveredKey marked that they
// delivered guide id: a push still reads it, so that a guide they
// delivered is not delivered again after an upgrade.
func (k Keyspace) PushedKey(uid, id string) string {
	return k.bucketPrefix(Bucket(uid)) + "pg:" + id
}

// RouteKey maps uid to the gateway instances holding its connections:
// HASH instance -> connection count.
func (k Keyspace) RouteKey(uid string) string { return k.RouteKeyPrefix(Bucket(uid)) + uid }

// RouteStampKey holds when each instance in uid's route last wrote its
// count: HASH instance -> ms, by Redis's clock. Its fields follow the
// route's.
func (k Keyspace) RouteStampKey(uid string) string { return k.bucketPrefix(Bucket(uid)) + "rs:" + uid }

// RouteKeyPrefix is what every route key of bucket b starts with.
func (k Keyspace) RouteKeyPrefix(b int) string { return k.bucketPrefix(b) + "rt:" }

// TimelineKey holds uid's decision timeline: a list of entries, oldest
// first, each stamped with Redis's clock (see Store.AppendTimeline). In
// the user's bucket, like the user's other keys.
func (k Keyspace) TimelineKey(uid string) string { return k.bucketPrefix(Bucket(uid)) + "tl:" + uid }

// InboxKey holds guides for uid while it has no connection: a capped LIST.
func (k Keyspace) InboxKey(uid string) string { return k.bucketPrefix(Bucket(uid)) + "in:" + uid }

// InboxLeaseKey holds which of uid's inbox guides a connection is being
// handed, until when, so a second connection does not take them too.
func (k Keyspace) InboxLeaseKey(uid string) string { return k.InboxKey(uid) + "/lease" }

// InboxSettledKey holds which of uid's guides a connection proved it got,
// until when, so that a copy of one on its way on (handed on from another
// connection, held and given back) is not kept for the next connect.
func (k Keyspace) InboxSettledKey(uid string) string { return k.InboxKey(uid) + "/settled" }

// PolicyKey holds the segments' policy (package policy reads and writes
// it).
func (k Keyspace) PolicyKey() string { return k.prefix + ":policy" }

// InstanceChannel is the Pub/Sub channel on which gateway instance id takes
// guides for its connections.
func (k Keyspace) InstanceChannel(id string) string { return k.prefix + ":gw:" + id }
