package wsread

import (
	"errors"
	"fmt"
	"runtime"
	"time"
)

// Mode says how connections are read.
type Mode string

const (
	// ModeEpoll waits for readable sockets on one epoll set and reads them on
	// a few resident workers (Linux only).
	ModeEpoll Mode = "epoll"
	// ModeGoroutine runs one goroutine per connection in ReadMessage.
	ModeGoroutine Mode = "goroutine"
)

// DefaultMode is epoll on Linux, goroutine elsewhere.
func DefaultMode() Mode {
	if epollSupported {
		return ModeEpoll
	}
	return ModeGoroutine
}

// ParseMode reads a mode name as given in a flag or an environment variable.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeEpoll, ModeGoroutine:
		return m, nil
	}
	return "", fmt.Errorf("wsread: unknown read mode %q (want %q or %q)", s, ModeEpoll, ModeGoroutine)
}

// Defaults of Config's zero values.
const (
	DefaultReadLimit     = 64 << 10
	DefaultSweepInterval = 250 * time.Millisecond
	DefaultLinger        = time.Second
	minWorkers           = 4
)

// ErrIdle is given to Handler.Closed when a connection's read deadline
// passed (the sweep found it; see Config.SweepInterval).
var ErrIdle = errors.New("wsread: read deadline passed")

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	// Mode is how connections are read; "" = DefaultMode().
	Mode Mode
	// Workers is the number of resident workers reading readable
	// connections (epoll); 0 = 2×GOMAXPROCS, at least 4. Handlers run on
	// them: a handler that blocks holds up other connections until the
	// next worker takes the set (within 10 ms), and stalls them all
	// once every worker is in one.
	Workers int
	// ReadLimit is the largest message, as gorilla's SetReadLimit (Serve
	// sets it); 0 = 64 KiB. It sizes the pooled batch buffers (2×limit+512
	// bytes, one per busy worker); an incomplete message whose frames
	// cannot fit one (tiny fragments, control frames between them) ends
	// the connection with 1009, as a message over the limit does.
	ReadLimit int64
	// SweepInterval is how often read deadlines and lingers are checked
	// (epoll); 0 = 250ms. A connection ends up to this late.
	SweepInterval time.Duration
	// Linger is how long, after gorilla sent a close for a protocol error
	// or the read limit, input is read and dropped until the peer hangs up;
	// 0 = 1s. It gives the peer time to read the close frame instead of a
	// reset.
	Linger time.Duration
}

// withDefaults returns cfg with its zero values filled in, or an error
// naming a bad field.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Mode == "" {
		cfg.Mode = DefaultMode()
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return cfg, err
	}
	if cfg.Mode == ModeEpoll && !epollSupported {
		return cfg, fmt.Errorf("wsread: mode %q needs Linux (this is %s)", ModeEpoll, runtime.GOOS)
	}
	if cfg.Workers < 0 {
		return cfg, fmt.Errorf("wsread: Workers %d is negative", cfg.Workers)
	}
	if cfg.Workers == 0 {
		cfg.Workers = max(2*runtime.GOMAXPROCS(0), minWorkers)
	}
	if cfg.ReadLimit < 0 {
		return cfg, fmt.Errorf("wsread: ReadLimit %d is negative", cfg.ReadLimit)
	}
	if cfg.ReadLimit == 0 {
		cfg.ReadLimit = DefaultReadLimit
	}
	if cfg.SweepInterval < 0 || cfg.Linger < 0 {
		return cfg, fmt.Errorf("wsread: SweepInterval %v or Linger %v is negative", cfg.SweepInterval, cfg.Linger)
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	return cfg, nil
}
