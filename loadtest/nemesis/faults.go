package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/stillthere/stillthere/pkg/promise"
	"github.com/stillthere/stillthere/pkg/session"
)

// redisActWithin bounds one act on the cluster (a failover, a reshard).
const redisActWithin = 90 * time.Second

// outcome is what became of one planned fault.
type outcome struct {
	planned
	Start, End time.Time
	Err        error
}

// grace is how long past a fault's end the stages it met may wait more:
// the listener's outage grace and a margin; a consumer's partitions move
// only after the group's session timeout.
func (r *rig) graceOf(kind string) time.Duration {
	g := checkGrace(r.s)
	if strings.Contains(kind, "consumer") || kind == "kafka refuse fetch" {
		g += groupSessionTimeout
	}
	return g
}

// run causes p, holds it for its length, heals it and records its window.
// A fault that fails to start or heal is still recorded, with the error:
// the stack met whatever it did.
func (r *rig) runFault(ctx context.Context, p planned, rec *recorder) outcome {
	o := outcome{planned: p, Start: time.Now()}
	heal, err := r.cause(ctx, p)
	o.Err = err
	if p.For > 0 {
		sleepCtx(ctx, time.Until(o.Start.Add(p.For)))
	}
	if heal != nil {
		// Healed even when the run is ending, so that nothing is left
		// paused or cut.
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisActWithin)
		if err := heal(hctx); err != nil && o.Err == nil {
			o.Err = fmt.Errorf("heal: %w", err)
		}
		cancel()
	}
	o.End = time.Now()
	rec.fault(promise.Fault{Kind: p.Kind, Start: o.Start, End: o.End, Grace: r.graceOf(p.Kind)})
	return o
}

// cause starts fault p and returns what heals it (nil: nothing to heal,
// the act was the fault).
func (r *rig) cause(ctx context.Context, p planned) (func(context.Context) error, error) {
	svc := func(group []*service) *service { return group[p.Target%len(group)] }
	stop := func(s *service) (func(context.Context) error, error) {
		s.pause()
		return func(context.Context) error { s.resume(); return nil }, nil
	}
	kill := func(s *service) (func(context.Context) error, error) {
		r.expect(s)
		s.kill()
		return s.start, nil
	}
	switch p.Kind {
	case "sigstop gateway":
		return stop(svc(r.gateways))
	case "sigstop listener":
		return stop(svc(r.listeners))
	case "sigstop consumer":
		return stop(svc(r.consumers))
	case "sigkill gateway":
		return kill(svc(r.gateways))
	case "sigkill listener":
		return kill(svc(r.listeners))
	case "sigkill consumer":
		return kill(svc(r.consumers))
	case "cut user-gateway":
		px := r.pub[p.Target%nGateways]
		px.Cut()
		return func(context.Context) error { px.Restore(); return nil }, nil
	case "cut activity-gateway":
		px := r.act[p.Target%nGateways]
		px.Cut()
		return func(context.Context) error { px.Restore(); return nil }, nil
	case "cut consumer-gateway":
		px := r.push[p.Target%nConsumers]
		px.Cut()
		return func(context.Context) error { px.Restore(); return nil }, nil
	case "push duplicate", "push reorder":
		rl := r.relays[p.Target%nConsumers]
		mode := relayDuplicate
		if p.Kind == "push reorder" {
			mode = relayReorder
		}
		rl.mode.Store(mode)
		return func(context.Context) error { rl.mode.Store(relayForward); return nil }, nil
	case "kafka refuse produce":
		r.refuseProduce.Store(true)
		return func(context.Context) error { r.refuseProduce.Store(false); return nil }, nil
	case "kafka refuse fetch":
		r.refuseFetch.Store(true)
		return func(context.Context) error { r.refuseFetch.Store(false); return nil }, nil
	case "cpu hog":
		return r.cpuHog(p.For)
	case "mass silence":
		r.crowd.hush(p.Target, 3, time.Now().Add(p.For))
		return nil, nil
	case "redis pause":
		r.redisMu.Lock()
		m := r.cluster.Masters[p.Target%nMasters]
		r.redisMu.Unlock()
		m.Pause()
		return func(ctx context.Context) error {
			m.Resume()
			// Paused past the node timeout, the master was failed over
			// by its replica.
			r.redisMu.Lock()
			defer r.redisMu.Unlock()
			return r.cluster.Resync(ctx)
		}, nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisActWithin)
	defer cancel()
	r.redisMu.Lock()
	defer r.redisMu.Unlock()
	if err := r.cluster.Resync(actx); err != nil {
		return nil, fmt.Errorf("before the act: %w", err)
	}
	i := p.Target % nMasters
	switch p.Kind {
	case "redis failover graceful":
		return nil, r.cluster.HandOver(actx, i)
	case "redis failover hard":
		if err := r.cluster.Failover(actx, i); err != nil {
			return nil, err
		}
		return nil, r.cluster.AddReplica(actx, i)
	case "redis restart empty":
		return nil, r.cluster.Masters[i].RestartEmpty(actx)
	case "redis reshard":
		return nil, r.reshard(actx, p)
	}
	return nil, fmt.Errorf("fault kind %q not implemented", p.Kind)
}

// reshard moves the slot of one bucket of users (drawn from the fault's
// time) to the next master.
func (r *rig) reshard(ctx context.Context, p planned) error {
	ks, err := session.NewKeyspace(keyPrefix)
	if err != nil {
		return err
	}
	uid := fmt.Sprintf("ws-%03d", int(p.At/time.Second)%max(r.s.users, 1))
	slot, err := r.cluster.SlotOf(ctx, ks.IndexKey(session.Bucket(uid)))
	if err != nil {
		return err
	}
	owner, err := r.cluster.SlotOwner(ctx, slot)
	if err != nil {
		return err
	}
	return r.cluster.MigrateSlot(ctx, slot, (owner+1)%nMasters, 50, 0)
}

// cpuHog runs a CPU hog on every core for d: stress-ng when installed,
// else shell busy loops.
func (r *rig) cpuHog(d time.Duration) (func(context.Context) error, error) {
	var cmd *exec.Cmd
	if path, err := exec.LookPath("stress-ng"); err == nil {
		cmd = exec.Command(path, "--cpu", "0", "--timeout", fmt.Sprintf("%ds", int(d.Seconds())+1), "--quiet")
	} else {
		cmd = exec.Command("sh", "-c", "for i in 1 2; do (while :; do :; done) & done; wait")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cpu hog: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	return func(context.Context) error {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return nil
	}, nil
}
