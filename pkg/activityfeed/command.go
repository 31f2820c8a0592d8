package activityfeed

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
)

const usage = `usage: gateway activity-feed show|forget [redis settings]

show prints the activity feed's watermark: for each partition of the
activity topic, the time (Redis's clock) before which every record was
applied, and how far it trails now. The listener judges no deadline past
the earliest.

forget deletes the watermark, for a deployment that turns the feed off
for good: until then, every deadline past its last stamp stays held, and
every deadline at all if a member started and none ever stamped (Kafka
out of reach since). A feed still running stamps it again; a gateway
with the feed on marks it again as it starts.
`

// Command runs the operator command with args such as ["show"], writing
// its report to out.
func Command(ctx context.Context, args []string, env config.Lookup, out io.Writer) error {
	if len(args) == 0 || (args[0] != "show" && args[0] != "forget") {
		fmt.Fprint(out, usage)
		return errors.New("usage: want show or forget")
	}
	fs := flag.NewFlagSet("activity-feed "+args[0], flag.ContinueOnError)
	fs.SetOutput(out)
	b := config.NewBinder(fs, env)
	var rc redisconn.Config
	rc.Bind(b)
	if err := b.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), usage)
	}
	if err := rc.Validate(); err != nil {
		return err
	}
	rdb, err := redisconn.Open(ctx, rc)
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := session.NewStore(rdb, rc.Keyspace())
	if args[0] == "forget" {
		if err := store.ForgetActivity(ctx); err != nil {
			return err
		}
		fmt.Fprintln(out, "activity watermark deleted: the listener no longer waits for the feed")
		return nil
	}
	c, err := store.ActivityControl(ctx)
	if err != nil {
		return err
	}
	return show(out, c)
}

// show writes the watermark in c, a partition a line.
func show(out io.Writer, c session.Control) error {
	w, fed := c.ActivityWatermark()
	if !fed {
		_, err := fmt.Fprintln(out, "no activity feed has run: the listener does not wait for one")
		return err
	}
	if len(c.Activity) == 0 {
		_, err := fmt.Fprintln(out, "an activity feed started and has not stamped (Kafka out of its reach?): the listener holds every deadline until it does")
		return err
	}
	parts := make([]int32, 0, len(c.Activity))
	for p := range c.Activity {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	fmt.Fprintf(out, "watermark %s, %v behind Redis's clock\n", w.UTC().Format("15:04:05.000"), c.Now.Sub(w))
	for _, p := range parts {
		fmt.Fprintf(out, "  partition %d: %s (%v behind)\n", p, c.Activity[p].UTC().Format("15:04:05.000"), c.Now.Sub(c.Activity[p]))
	}
	return nil
}
