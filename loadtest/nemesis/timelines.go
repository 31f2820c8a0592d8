package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// readTimeline reads uid's timeline from the stack's Redis with
// "gateway timeline", the services' own settings.
func (r *rig) readTimeline(ctx context.Context, uid string, asJSON bool) ([]byte, error) {
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	args := []string{"timeline", "-utc", uid}
	if asJSON {
		args = []string{"timeline", "-json", uid}
	}
	cmd := exec.CommandContext(tctx, filepath.Join(r.s.bin, "gateway"), args...)
	cmd.Env = append(os.Environ(), r.common()...)
	cmd.Stderr = os.Stderr
	return cmd.Output()
}

// saveTimelines writes, beside the services' logs, the timeline of every
// user in uids as a table, before the rig and its Redis go. One that
// cannot be read says so in its file.
func (r *rig) saveTimelines(ctx context.Context, uids []string) {
	for _, uid := range uids {
		out, err := r.readTimeline(ctx, uid, false)
		if err != nil {
			out = append(out, fmt.Sprintf("\n(gateway timeline: %v)\n", err)...)
		}
		path := filepath.Join(r.dir, "logs", "timeline-"+uid+".txt")
		if err := os.WriteFile(path, out, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "nemesis:", err)
		}
	}
}
