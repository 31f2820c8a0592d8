package redisconn

import (
	"context"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver"
)

func TestInfoField(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nrun_id:3a77f691a785\r\nuptime_in_seconds:12\r\n"
	for name, want := range map[string]string{"run_id": "3a77f691a785", "uptime_in_seconds": "12", "run": "", "missing": ""} {
		if got := InfoField(info, name); got != want {
			t.Errorf("InfoField(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestMasterRunsSeesARestart: a real redis-server's run id changes when it
// restarts, and its uptime starts again.
func TestMasterRunsSeesARestart(t *testing.T) {
	ctx := context.Background()
	srv, err := redisserver.Start(ctx, redisserver.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	rdb, err := Open(ctx, Config{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	before, err := MasterRuns(ctx, rdb)
	if err != nil || len(before) != 1 || before[srv.Addr].ID == "" {
		t.Fatalf("runs %v, %v; want the one server's", before, err)
	}
	if err := srv.RestartEmpty(ctx); err != nil {
		t.Fatal(err)
	}
	var after map[string]Run
	deadline := time.Now().Add(10 * time.Second)
	for after, err = MasterRuns(ctx, rdb); err != nil && time.Now().Before(deadline); after, err = MasterRuns(ctx, rdb) {
		time.Sleep(50 * time.Millisecond) // polling, within the deadline above: nothing signals that the restarted server answers again
	}
	if err != nil {
		t.Fatal(err)
	}
	if a, b := after[srv.Addr], before[srv.Addr]; a.ID == "" || a.ID == b.ID || a.Up > time.Minute {
		t.Errorf("after a restart: %+v, before %+v; want a new run id, just up", a, b)
	}
}
