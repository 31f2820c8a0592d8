package session

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Presence across devices. A user is present while any of their
// connections pings, on any gateway instance. Each instance writes, in the
// user's route key, how many connections of the user it holds; a normal
// close ends the session only when the route, after the closing
// connection is counted out, holds none. The route key shares the user's
// bucket hash tag with the session's keys, so one script does both,
// atomically, on a Redis Cluster too.
// The keys are in the key table (keys.go): RouteKey, RouteStampKey,
// DeliveredKey, InboxKey, InboxLeaseKey, InboxSettledKey.

// routeScript writes one instance's connection count of one user,
// absolutely (a count that a failed write left wrong heals with the next
// one), drops the entries of instances known dead, and refreshes the
// key's TTL while any connection is left. With end set, a normal close
// asked to end the session: it does, as endScript does, only when no
// connection of the user is left on any instance, and Redis knows of no
// renewal since the close.
//
// A close may land long after it was made: through an outage it waits in
// its instance's route writer. Meanwhile the user may have come back on
// another instance and pinged there, in the same outage; that instance's
// resync restores the ping once Redis is back, at the ping's time, and
// its route count may be written after this. So the end is recorded at
// the close (ARGV[7] ms before Redis's now), not when it lands, and a
// renewal recorded after that time refuses it: the resync that lands first
// keeps the session, and one that lands after finds no renewal or end
// newer than its ping, and restores it (see renewScript).
//
// Beside the counts, the route stamps say when each instance last wrote
// its count, by Redis's clock. An instance judged dead loses only the
// entries it wrote before the judge's cut (DeadInstance): a judge whose
// view of the heartbeats is older than the instance's return (a stall
// past its lease, then a heartbeat that finds the gap) cannot drop what
// it wrote since. An entry without a stamp is dropped as dead. A dropped
// entry is remembered in the stamps for the listener's hold rules (see
// routedrop.lua): the instance's clients may still be pinging it, cut off
// from Redis.
// An end that cancels a hold on the user's timeout says so in their
// timeline (see HoldNotes). ARGV: instance, count, ttl ms, end (1/0),
// uid, keep ms, ms since the close, the note block (4), then pairs of a
// dead instance and its cut ms.
// Returns {connections left, 1 if the session was ended}.
var routeScript = newScript[routeKeys]("route", nil, []codec{holdNoteCodec{}, droppedKeep{}}, "holdnote", "routedrop")

// RouteCount is one gateway instance's connections of one user.
type RouteCount struct {
	UID   string
	Count int
	// End asks to end the user's session, as a normal close (1000) does,
	// if no connection of theirs is left on any instance.
	End bool
	// EndAgo is how long ago the close was: the end is recorded then, and
	// a renewal Redis knows of since refuses it.
	EndAgo time.Duration
}

// RouteResult is what writing one RouteCount found.
type RouteResult struct {
	Left  int  // the user's connections on every instance, after the write
	Ended bool // the session was ended
	// Inbox: the user's inbox held guides after the write. A connect that
	// finds it empty need not take it; a guide kept later is for its
	// keeper to hand over (see route.lua).
	Inbox bool
	Err   error
}

// DeadInstance is a gateway instance judged dead by its heartbeats, as a
// judge last read them. Its route entries written up to Cut, by Redis's
// clock, are of the life that ended; one written after is of a life the
// judge has not seen yet, and stays.
type DeadInstance struct {
	Name string
	Cut  time.Time
}

// deadArgs appends the dead instances but self to argv, as the scripts
// take them.
func deadArgs(argv []any, self string, dead []DeadInstance) []any {
	for _, d := range dead {
		if d.Name != self {
			argv = append(argv, d.Name, d.Cut.UnixMilli())
		}
	}
	return argv
}

// WriteRoutes writes instance's counts in its users' route keys, in one
// pipelined round trip, with one atomic script per user. Entries of the
// dead instances are dropped on the way; ttl is the route keys' TTL,
// refreshed while a connection is left. Writes a moving cluster slot
// refuses are sent again for up to DefaultSlotRetry. Results are in the
// order of counts.
func (s *Store) WriteRoutes(ctx context.Context, instance string, counts []RouteCount, ttl time.Duration, dead []DeadInstance) []RouteResult {
	args := func(c RouteCount) (keys routeKeys, argv []any) {
		end := 0
		if c.End {
			end = 1
		}
		argv = deadArgs(s.withNotes(instance, c.Count, ttl.Milliseconds(), end, c.UID, RenewedKeep.Milliseconds(), max(c.EndAgo, 0).Milliseconds()), instance, dead)
		return routeKeys{Route: s.ks.RouteKey(c.UID), sessionKeys: s.ks.sessionKeys(c.UID), Stamps: s.ks.RouteStampKey(c.UID),
			Timeline: s.ks.TimelineKey(c.UID), Inbox: s.ks.InboxKey(c.UID)}, argv
	}
	cmds := s.runScripts(ctx, len(counts), func(i int) (*redis.Script, []string, []any) {
		keys, argv := args(counts[i])
		return routeScript.call(keys, argv...)
	}, DefaultSlotRetry)
	out := make([]RouteResult, len(counts))
	for i, cmd := range cmds {
		v, err := cmd.Int64Slice()
		if err == nil && len(v) != 3 {
			err = fmt.Errorf("%w: %d values", errReply, len(v))
		}
		if err != nil {
			out[i].Err = fmt.Errorf("write route of %q: %w", counts[i].UID, err)
			continue
		}
		out[i] = RouteResult{Left: int(v[0]), Ended: v[1] == 1, Inbox: v[2] == 1}
	}
	return out
}

// dropRoutesScript drops dead instances' entries from one route key, as
// routeScript does. ARGV: pairs of a dead instance and its cut ms.
// Returns {dropped, kept}: kept entries were written after their cut.
var dropRoutesScript = newScript[routeStampKeys]("drop_routes", nil, []codec{droppedKeep{}}, "routedrop")

// DroppedRouteKeep is how long a route entry dropped as dead is
// remembered (routedrop.lua) where no route key gives a TTL: the drop took
// the user's last entry. Twice the gateways' route TTL by default, as a
// route write keeps it: far past any outage grace, within which alone it
// holds anything.
const DroppedRouteKeep = 20 * time.Minute

// droppedKeep writes DroppedRouteKeep into a script's source, as
// keepDropped (ms).
type droppedKeep struct{}

func (droppedKeep) lua() string {
	return fmt.Sprintf("local keepDropped = %d\n", DroppedRouteKeep.Milliseconds())
}

// DropDeadRoutes drops the entries of dead instances from uid's route,
// each only if written up to its cut. It returns how many it dropped, and
// how many it kept because they were written after their cut: the
// instance is back.
func (s *Store) DropDeadRoutes(ctx context.Context, uid string, dead []DeadInstance) (dropped, kept int, err error) {
	argv := deadArgs(nil, "", dead)
	if len(argv) == 0 {
		return 0, 0, nil
	}
	v, err := dropRoutesScript.Run(ctx, s.rdb, routeStampKeys{Route: s.ks.RouteKey(uid), Stamps: s.ks.RouteStampKey(uid)}, argv...).Int64Slice()
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("%w: %d values", errReply, len(v))
	}
	if err != nil {
		return 0, 0, fmt.Errorf("drop dead instances from the route of %q: %w", uid, err)
	}
	return int(v[0]), int(v[1]), nil
}

// instancesScript reads the gateway instances' heartbeats with the clock
// of the node that holds them. Returns {now, HGETALL}.
var instancesScript = newScript[aliveKeys]("instances", nil, nil)

// instancesOfScript reads some instances' heartbeats with the clock:
// instances_of.lua.
var instancesOfScript = newScript[aliveKeys]("instances_of", nil, nil)

// InstancesOf is Instances for the instances named only: Redis's clock,
// and the heartbeat of each that has one.
func (s *Store) InstancesOf(ctx context.Context, names []string) (time.Time, map[string]Instance, error) {
	if len(names) == 0 {
		return time.Time{}, map[string]Instance{}, nil
	}
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	vals, err := instancesOfScript.Run(ctx, s.rdb, aliveKeys{Alive: s.ks.AliveKey()}, args...).Slice()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read gateway instances %v: %w", names, err)
	}
	if len(vals) != 2 {
		return time.Time{}, nil, fmt.Errorf("read gateway instances %v: %w: %d values", names, errReply, len(vals))
	}
	nowMS, _ := vals[0].(int64)
	got, _ := vals[1].([]any)
	out := map[string]Instance{}
	for i, v := range got {
		str, ok := v.(string)
		if !ok || i >= len(names) {
			continue
		}
		if inst, err := parseInstance(str); err == nil {
			out[names[i]] = inst
		}
	}
	return time.UnixMilli(nowMS), out, nil
}

// Instances reads every gateway instance's last heartbeat and Redis's
// clock, so a caller can tell which instances are alive (Instance.AliveAt)
// without a clock of its own.
func (s *Store) Instances(ctx context.Context) (time.Time, map[string]Instance, error) {
	vals, err := instancesScript.Run(ctx, s.rdb, aliveKeys{Alive: s.ks.AliveKey()}).Slice()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read gateway instances: %w", err)
	}
	if len(vals) != 2 {
		return time.Time{}, nil, fmt.Errorf("read gateway instances: %w: %d values", errReply, len(vals))
	}
	nowMS, _ := vals[0].(int64)
	out := map[string]Instance{}
	alive, _ := vals[1].([]any)
	for i := 0; i+1 < len(alive); i += 2 {
		name, _ := alive[i].(string)
		v, _ := alive[i+1].(string)
		if inst, err := parseInstance(v); err == nil {
			out[name] = inst
		}
	}
	return time.UnixMilli(nowMS), out, nil
}
