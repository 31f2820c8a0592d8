package guide

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"

	"github.com/sony/gobreaker/v2"
)

// childEnv marks the test binary run as a consumer process.
const childEnv = "GUIDE_TEST_CONSUMER_CHILD"

// TestHelperConsumerProcess is not a test of its own: run as a child of
// the test binary, it is a consumer process that a test can kill.
func TestHelperConsumerProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("runs only as a child process")
	}
	cfg, err := LoadConfig(nil, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// startProcess runs a consumer with the env's settings in a child process.
func (e *testEnv) startProcess() *exec.Cmd {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperConsumerProcess$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	for k, v := range e.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	return cmd
}

// TestKilledBetweenSendAndCommit: a consumer process killed (SIGKILL)
// after the gateway showed a guide but before the consumer could commit
// it leaves the record uncommitted; the next consumer sends it again with
// the same id, the gateway dedupes it, and the user sees one guide.
func TestKilledBetweenSendAndCommit(t *testing.T) {
	e := newEnv(t)
	var evs []produced
	for _, uid := range uids("killed", 5) {
		evs = append(evs, e.produceTo(0, uid))
	}

	cmd := e.startProcess()
	killed := make(chan struct{})
	var once sync.Once
	kill := func() {
		once.Do(func() {
			cmd.Process.Kill()
			cmd.Wait()
			close(killed)
		})
	}
	t.Cleanup(kill)
	// The first guide shown kills the consumer before the push is
	// answered: it was sent, and can never have been committed.
	e.gw.OnShown(func(string) { kill() })
	<-killed
	e.gw.OnShown(nil)
	if got := e.committed(e.cfg.Group)[0]; got > evs[0].offset {
		t.Fatalf("killed consumer committed partition 0 up to %d, past the guide it never saw answered (offset %d)", got, evs[0].offset)
	}
	first := ""
	for _, p := range evs {
		if e.gw.Shown(p.ev.ID) {
			first = p.ev.ID
		}
	}
	if first == "" {
		t.Fatal("no guide shown before the kill")
	}

	dup0 := guidesSettled(t, OutcomeDuplicate)
	e.start(e.cfg)
	e.waitShown(evs)
	e.waitCommittedToEnd(e.cfg.Group)
	e.checkShownOnce(t, evs)
	if n := e.gw.Attempts(first); n != 2 {
		t.Errorf("guide shown before the kill pushed %d times, want 2 (once by each process)", n)
	}
	if d := guidesSettled(t, OutcomeDuplicate) - dup0; d < 1 {
		t.Errorf("duplicate outcomes after the restart: %v, want at least 1", d)
	}
}

// TestTakeoverDuringOutage: a member stopped while the gateway is down
// hands its partitions to one whose breaker is open too; that member
// pauses them at once, holds their records, and delivers each once when
// the gateway is back.
func TestTakeoverDuringOutage(t *testing.T) {
	e := newEnv(t)
	a, b := e.start(e.cfg), e.start(e.cfg)
	waitFor(t, "both members to own partitions", func() bool {
		n, parts := e.groupMembers(e.cfg.Group)
		return n == 2 && parts[0] > 0
	})
	first := e.produce(uids("first", 8)...)
	e.waitShown(first)
	e.waitCommittedToEnd(e.cfg.Group)
	held := e.committed(e.cfg.Group)

	e.gw.SetDown(true)
	second := e.produce(uids("held", 24)...)
	waitFor(t, "both breakers to open and both members to pause", func() bool {
		return a.c.breaker.State() != gobreaker.StateClosed && b.c.breaker.State() != gobreaker.StateClosed &&
			len(a.paused()) > 0 && len(b.paused()) > 0
	})
	a.stop()
	waitFor(t, "the remaining member to own and pause every partition", func() bool {
		n, parts := e.groupMembers(e.cfg.Group)
		return n == 1 && parts[0] == testPartitions && slices.Equal(b.paused(), []int32{0, 1, 2, 3})
	})
	if got := e.committed(e.cfg.Group); !maps.Equal(got, held) {
		t.Errorf("committed %v during the outage, want %v held", got, held)
	}

	e.gw.SetDown(false)
	all := append(first, second...)
	e.waitShown(all)
	e.waitCommittedToEnd(e.cfg.Group)
	e.checkShownOnce(t, all)
	waitFor(t, "fetching to resume", func() bool { return len(b.paused()) == 0 })
}
