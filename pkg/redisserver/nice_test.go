package redisserver_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stillthere/stillthere/pkg/redisserver"
)

// TestNice: a server started with Nice runs at that priority, every
// thread of it, and still pauses and answers as any other.
func TestNice(t *testing.T) {
	ctx := context.Background()
	srv := start(t, redisserver.Options{Nice: 5}) // a lower priority needs no privilege
	rdb := client(t, srv)
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`process_id:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("no process_id in INFO server")
	}
	tasks, err := os.ReadDir("/proc/" + m[1] + "/task")
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	for _, task := range tasks {
		stat, err := os.ReadFile("/proc/" + m[1] + "/task/" + task.Name() + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		// The fields after the command's closing parenthesis: nice is
		// the 19th of the line, the 17th after it.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if nice, _ := strconv.Atoi(fields[16]); nice != 5 {
			t.Errorf("thread %s of redis-server runs at nice %d, want 5", task.Name(), nice)
		}
	}
	srv.Pause()
	srv.Resume()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after a pause: %v", err)
	}
}
