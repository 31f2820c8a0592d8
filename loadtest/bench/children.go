package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// runJSON runs one of the bench programs that print a JSON object on
// stdout and decodes it into v. Its stderr passes through.
func runJSON(ctx context.Context, limit time.Duration, v any, bin, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := command(ctx, 30*time.Second, filepath.Join(bin, name), args...)
	var out, errOut bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(os.Stderr, &errOut)
	err := cmd.Run()
	killGroup(cmd) // whatever it left behind
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, why(name, errOut.String()))
	}
	// The object is the last thing printed; anything before it is chatter.
	b := out.Bytes()
	if i := bytes.IndexByte(b, '{'); i > 0 {
		b = b[i:]
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s printed no JSON object: %w", name, err)
	}
	return nil
}

// why picks the line of a failed program's stderr that says why: its
// last "name: ..." line, or else its first (a flag error).
func why(name, stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], name+":") {
			return lines[i]
		}
	}
	return lines[0]
}

// available reports whether a bench program was built.
func available(bin, name string) bool {
	_, err := os.Stat(filepath.Join(bin, name))
	return err == nil
}

func commandLine(name string, args ...string) string {
	return strings.Join(append([]string{"bin/" + name}, args...), " ")
}

// DetectMode is one detection mode's row of detectbench's output.
type DetectMode struct {
	Mode       string  `json:"mode"`
	Replicas   int     `json:"replicas"`
	Silent     int     `json:"silent"`
	Produced   int     `json:"produced"`
	Lost       int     `json:"lost"`
	Duplicates int     `json:"duplicates"`
	LagP50ms   float64 `json:"lag_p50_ms"`
	LagP99ms   float64 `json:"lag_p99_ms"`
	LagMaxms   float64 `json:"lag_max_ms"`
	Held       int     `json:"held"` // timeouts held for the grace: none, unless something looked like an outage
	// Whole guides at a webhook, through the consumer.
	Guided        int     `json:"guided"`
	GuidesDoubled int     `json:"guides_doubled"`
	GuideP50ms    float64 `json:"guide_p50_ms"`
	GuideP99ms    float64 `json:"guide_p99_ms"`
	GuideMaxms    float64 `json:"guide_max_ms"`
	// The close stage, CloseAfterS after the reminder: lateness from
	// when it was due, of its events and its guides.
	CloseAfterS   float64 `json:"close_after_s"`
	Closed        int     `json:"closed"`
	CloseLagP50   float64 `json:"close_lag_p50_ms"`
	CloseLagP99   float64 `json:"close_lag_p99_ms"`
	CloseLagMax   float64 `json:"close_lag_max_ms"`
	CloseGuided   int     `json:"close_guided"`
	CloseGuideP50 float64 `json:"close_guide_p50_ms"`
	CloseGuideP99 float64 `json:"close_guide_p99_ms"`
	CloseGuideMax float64 `json:"close_guide_max_ms"`
	// Redis commands per second (those scripts run included), and script
	// calls: the listeners idle (nothing due), and while the silences
	// expire (listeners and consumer).
	IdleCallsPerS     float64 `json:"idle_calls_per_s"`
	IdleScriptsPerS   float64 `json:"idle_scripts_per_s"`
	ExpiryCallsPerS   float64 `json:"expiry_calls_per_s"`
	ExpiryScriptsPerS float64 `json:"expiry_scripts_per_s"`
}

// Storm is detectbench's storm: sessions expiring within one window, past
// the mass-expiry brake's threshold.
type Storm struct {
	Sessions  int     `json:"sessions"`
	WindowMs  float64 `json:"window_ms"`
	Delivered int     `json:"delivered"`
	Lost      int     `json:"lost"`
	Doubled   int     `json:"doubled"`
	Resent    int     `json:"resent"`  // posts of an id already taken, collapsed by the idempotency key
	AtOnce    int     `json:"at_once"` // delivered before any held one could be released
	Held      int     `json:"held"`    // held by the mass-expiry brake for the grace, then rechecked
	HeldOther int     `json:"held_other"`
	GraceMs   float64 `json:"grace_ms"`
	// The listener's brake: it holds lapses past max(floor, share × live
	// sessions) within the window.
	BrakeFloor     int     `json:"brake_floor"`
	BrakeShare     float64 `json:"brake_share"`
	BrakeWindow    string  `json:"brake_window"`
	AllDeliveredMs float64 `json:"all_delivered_ms"`
	WaitedMs       float64 `json:"waited_ms"`
	// From the first release to the last guide: its time, the CPU of
	// detectbench's process (listener, Kafka, consumer, webhook) and of
	// Redis, and how busy the machine's cores were (-1: unknown).
	ReleaseMs          float64 `json:"release_ms"`
	ReleaseSelfCPUS    float64 `json:"release_self_cpu_s"`
	RedisReleaseCPUS   float64 `json:"redis_release_cpu_s"`
	ReleaseMachineBusy float64 `json:"release_machine_busy"`
	// The same per half second of the release: the median and the
	// busiest. An older detectbench leaves them out: 0 then, read as
	// not measured.
	ReleaseBusyMedian float64 `json:"release_machine_busy_median"`
	ReleaseBusyPeak   float64 `json:"release_machine_busy_peak"`
	Cores             int     `json:"cores"`
}

// Detection is steps 3 and 4, as detectbench prints them.
type Detection struct {
	Command       string       `json:"command"`
	Live          int          `json:"live"`
	LiveWriteS    float64      `json:"live_write_s"`
	RedisMemoryMB float64      `json:"redis_memory_mb"`
	Silent        int          `json:"silent"`
	Modes         []DetectMode `json:"modes"`
	Storm         *Storm       `json:"storm"`
	// Timeline is what users' timelines held after the modes' silences,
	// StormTimeline after the storm's too.
	Timeline      *TimelineCost `json:"timeline"`
	StormTimeline *TimelineCost `json:"storm_timeline"`
	// TimelineOff is the hybrid mode again, with timeline-off, in the
	// same run: the guide latency the timeline must not slow.
	TimelineOff *Detection `json:"timeline_off,omitempty"`
}

// TimelineCost is detectbench's measure of the users' timelines in Redis.
type TimelineCost struct {
	Users       int     `json:"users"`
	Entries     int64   `json:"entries"`
	MaxEntries  int64   `json:"max_entries"`
	MemoryBytes int64   `json:"memory_bytes"`
	Silences    int     `json:"silences"`
	PerSilenceB float64 `json:"memory_per_silence_bytes"`
	EntriesPer  float64 `json:"entries_per_silence"`
}

type detectScale struct {
	Live, Silent, Storm int
	// Window and Wait, when set and detectbench takes them: the silent
	// sessions' deadlines spread, and the wait for events past the last.
	Window, Wait time.Duration
	// Grace is the listeners' outage grace, short so that what the
	// mass-expiry brake holds in the storm is delivered within the run;
	// detectbench waits at least the grace past every deadline.
	Grace time.Duration
	Limit time.Duration // the most detectbench may take
}

func detection(ctx context.Context, bin string, sc detectScale) (*Detection, error) {
	has := flagsOf(ctx, bin, "detectbench")
	args := []string{"-live", strconv.Itoa(sc.Live), "-silent", strconv.Itoa(sc.Silent),
		"-modes", "events,sweep,hybrid", "-storm", strconv.Itoa(sc.Storm)}
	if sc.Window > 0 && has["window"] {
		args = append(args, "-window", sc.Window.String())
	}
	if sc.Wait > 0 && has["wait"] {
		args = append(args, "-wait", sc.Wait.String())
	}
	if sc.Grace > 0 && has["grace"] {
		args = append(args, "-grace", sc.Grace.String())
	}
	if has["json"] {
		args = append(args, "-json")
	}
	d := &Detection{}
	fmt.Printf("detection: %d live, %d silent, storm of %d\n", sc.Live, sc.Silent, sc.Storm)
	err := runJSON(ctx, sc.Limit, d, bin, "detectbench", args...)
	// The command that reproduces it is ours, from the repository root.
	d.Command = commandLine("detectbench", args...)
	if err != nil || !has["timeline-off"] || ctx.Err() != nil {
		return d, err
	}
	// The timeline's cost on guide latency: hybrid again, recording
	// nothing, beside the run above.
	off := []string{"-live", strconv.Itoa(sc.Live), "-silent", strconv.Itoa(sc.Silent), "-modes", "hybrid", "-storm", "0", "-timeline-off"}
	off = append(off, args[8:]...) // -window, -wait, -grace as above
	d.TimelineOff = &Detection{}
	fmt.Printf("detection, timeline off: %d live, %d silent\n", sc.Live, sc.Silent)
	err = runJSON(ctx, sc.Limit, d.TimelineOff, bin, "detectbench", off...)
	d.TimelineOff.Command = commandLine("detectbench", off...)
	return d, err
}

// flagsOf lists the flags a program defines, from its -h.
func flagsOf(ctx context.Context, bin, name string) map[string]bool {
	cmd := command(ctx, time.Second, filepath.Join(bin, name), "-h")
	out, _ := cmd.CombinedOutput()
	has := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f, ok := strings.CutPrefix(line, "  -"); ok {
			has[strings.Fields(f)[0]] = true
		}
	}
	return has
}

// Consumer is step 5, as guidebench prints it.
type Consumer struct {
	Command                string  `json:"command"`
	Events                 int     `json:"events"`
	Partitions             int     `json:"partitions"`
	MaxInFlight            int     `json:"max_in_flight"`
	GuidesPerSecond        float64 `json:"guides_per_second"`
	Queued                 int     `json:"queued"`
	BreakerTimeoutSeconds  float64 `json:"breaker_timeout_seconds"`
	RecoveryToFirstSeconds float64 `json:"recovery_to_first_guide_seconds"`
	RecoveryToEmptySeconds float64 `json:"recovery_to_empty_backlog_seconds"`
	DrainGuidesPerSecond   float64 `json:"drain_guides_per_second"`
	ResentIDs              int     `json:"resent_ids"`
}

type consumerScale struct {
	Events, Queued int
	BreakerTimeout time.Duration
	Limit          time.Duration // the most guidebench may take
}

// consumer runs guidebench. It fails unless every event was delivered
// (throughput run and backlog), so a result means none was lost; resent
// ids were pushed again and deduped by the downstream, so none was shown
// twice.
func consumer(ctx context.Context, bin string, sc consumerScale) (*Consumer, error) {
	args := []string{"-events", strconv.Itoa(sc.Events), "-queued", strconv.Itoa(sc.Queued),
		"-breaker-timeout", sc.BreakerTimeout.String()}
	c := &Consumer{}
	fmt.Printf("consumer: %d events, %d queued behind an outage\n", sc.Events, sc.Queued)
	err := runJSON(ctx, sc.Limit, c, bin, "guidebench", args...)
	c.Command = commandLine("guidebench", args...)
	return c, err
}

// Activity is step 5b, as activitybench prints it.
type Activity struct {
	Command    string `json:"command"`
	Events     int    `json:"events"`
	Users      int    `json:"users"`
	Partitions int    `json:"partitions"`
	// Throughput is one run for each Redis: one redis-server, then a
	// Redis Cluster of two masters.
	Throughput []ActivityThroughput `json:"throughput"`
	// Lateness is the guide lateness of topic-fed sessions beside
	// WebSocket-fed ones (report_activity.go).
	Lateness *ActivityLateness `json:"lateness,omitempty"`
}

// ActivityThroughput is one throughput run of activitybench.
type ActivityThroughput struct {
	RedisMasters    int     `json:"redis_masters"`
	EventsPerSecond float64 `json:"events_per_second"`
	Seconds         float64 `json:"seconds"`
	Sessions        int64   `json:"sessions"`
	Redis           struct {
		CPUMicros float64 `json:"cpu_micros"`
	} `json:"redis_per_event"`
	RedisCores       []float64 `json:"redis_cores"`
	ProcessCPUMicros float64   `json:"process_cpu_micros_per_event"`
}

type activityScale struct {
	Events, Users int
	// Silent and Active are the lateness run's users per crowd, Spread
	// the time their silences spread over.
	Silent, Active int
	Spread         time.Duration
	Limit          time.Duration // the most activitybench may take
}

// activityStep runs activitybench. It fails unless every user has a
// session after, so a result means no event was lost; the lateness
// part's guides are judged by the report.
func activityStep(ctx context.Context, bin string, sc activityScale) (*Activity, error) {
	args := []string{"-events", strconv.Itoa(sc.Events), "-users", strconv.Itoa(sc.Users)}
	flags := flagsOf(ctx, bin, "activitybench")
	if flags["redis-masters"] {
		args = append(args, "-redis-masters", "1,2")
	}
	if flags["late-silent"] {
		args = append(args, "-late-silent", strconv.Itoa(sc.Silent), "-late-active", strconv.Itoa(sc.Active),
			"-late-spread", sc.Spread.String())
	}
	a := &Activity{}
	fmt.Printf("activity: %d events of %d users through the topic; lateness of %d silent users per crowd\n", sc.Events, sc.Users, sc.Silent)
	err := runJSON(ctx, sc.Limit, a, bin, "activitybench", args...)
	a.Command = commandLine("activitybench", args...)
	return a, err
}
