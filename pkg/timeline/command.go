package timeline

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/stillthere/stillthere/pkg/config"
	"github.com/stillthere/stillthere/pkg/redisconn"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/userid"
)

const usage = `usage: gateway timeline [flags] <uid>
Prints what stillthere decided about one user and why, oldest first,
read from Redis (the same settings as the gateway's).
`

// Command is "gateway timeline <uid>": it prints the user's timeline as
// a table (or JSON with -json).
func Command(ctx context.Context, args []string, env config.Lookup, out io.Writer) error {
	fs := flag.NewFlagSet("timeline", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, usage); fs.PrintDefaults() }
	b := config.NewBinder(fs, env)
	var rc redisconn.Config
	rc.Bind(b)
	asJSON := fs.Bool("json", false, "print the timeline as the HTTP endpoint answers it")
	utc := fs.Bool("utc", false, "print times in UTC, not local time")
	var keep time.Duration
	b.Duration(&keep, "timeline-keep", DefaultKeep, "entries older than this are not shown")
	if err := b.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("want one uid, got %d arguments", fs.NArg())
	}
	uid := fs.Arg(0)
	if !userid.Valid(uid) {
		return fmt.Errorf("uid %q: not a valid user id", uid)
	}
	if err := rc.Validate(); err != nil {
		return err
	}
	rdb, err := redisconn.Open(ctx, rc)
	if err != nil {
		return err
	}
	defer rdb.Close()
	entries, err := View(ctx, session.NewStore(rdb, rc.Keyspace()), uid, keep)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(Answer{UID: uid, Entries: entries})
	}
	if len(entries) == 0 {
		fmt.Fprintf(out, "no timeline for %q in the last %v\n", uid, keep)
		return nil
	}
	loc := time.Local
	if *utc {
		loc = time.UTC
	}
	return Format(out, entries, loc)
}
