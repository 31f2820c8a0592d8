package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A close stage's guide closes every connection that writes it, and a
// connection that takes it late (a gateway paused mid-push, a guide
// routed to an instance that reads it late, one held until a
// connection's first ping) may find its user came back meanwhile. Whether
// the close is applied is decided once, for every connection on every
// instance, by the first about to write it (CommitClose): cancelled if
// the user renewed after the silence's deadline, else applied. A
// connection that finds it applied writes it, however late, so that no
// device of a chat that was closed goes untold, unless it opened after
// the close was applied (CloseAppliedAt): the user come back; one that
// finds it cancelled drops it, and so does every other.

// closeCommitScript decides a close stage's guide once: close_commit.lua.
var closeCommitScript = newScript[closeKeys]("close_commit", closeOutcomes{Applied: closeApplied, Cancelled: closeCancelled}, nil)

const (
	closeApplied   = "applied"
	closeCancelled = "cancelled"
)

// closeOutcomes are close_commit.lua's answers.
type closeOutcomes struct{ Applied, Cancelled string }

// closeMode is how close_commit.lua decides (its ARGV[3]).
type closeMode string

const (
	closeCancelOnly closeMode = "0" // decide a cancellation only
	closeDecide     closeMode = "1" // cancelled if the user renewed after the deadline, else applied
	closeApply      closeMode = "2" // applied, whatever the user did since
)

// CommitClose decides whether uid's close stage guide id, of the silence
// whose deadline was deadlineMS, is applied: the first call decides, by
// whether the user renewed (or ended) their session after the deadline,
// and the decision is kept for keep; every later call gets it.
func (s *Store) CommitClose(ctx context.Context, uid, id string, deadlineMS int64, keep time.Duration) (applied bool, err error) {
	applied, _, err = s.CommitCloseAt(ctx, uid, id, deadlineMS, keep)
	return applied, err
}

// CommitCloseAt is CommitClose, with when the close was applied (Unix ms,
// Redis's clock; see CloseAppliedAt), read with the decision: 0 when not
// applied, or applied by a gateway before the time was kept.
func (s *Store) CommitCloseAt(ctx context.Context, uid, id string, deadlineMS int64, keep time.Duration) (applied bool, appliedAt int64, err error) {
	got, at, err := s.runClose(ctx, uid, id, deadlineMS, keep, closeDecide)
	return got == closeApplied, at, err
}

// ApplyClose is CommitClose deciding applied whatever the user did since
// the deadline: for a close that must not be cancelled (its silence's
// earlier stage went out; see LaterStageGoes), or one whose silence has
// no deadline to judge by. A close decided already keeps its decision:
// applied reports it.
func (s *Store) ApplyClose(ctx context.Context, uid, id string, keep time.Duration) (applied bool, err error) {
	applied, _, err = s.ApplyCloseAt(ctx, uid, id, keep)
	return applied, err
}

// ApplyCloseAt is ApplyClose, with when the close was applied, as
// CommitCloseAt reads it.
func (s *Store) ApplyCloseAt(ctx context.Context, uid, id string, keep time.Duration) (applied bool, appliedAt int64, err error) {
	got, at, err := s.runClose(ctx, uid, id, 0, keep, closeApply)
	return got == closeApplied, at, err
}

// CancelCloseIfOver is CommitClose for a caller that writes nothing: it
// decides only a cancellation (the user renewed after the deadline), and
// leaves a close not over undecided, for the connection that writes it.
// It reports whether the close is cancelled, now or before.
func (s *Store) CancelCloseIfOver(ctx context.Context, uid, id string, deadlineMS int64, keep time.Duration) (cancelled bool, err error) {
	got, _, err := s.runClose(ctx, uid, id, deadlineMS, keep, closeCancelOnly)
	return got == closeCancelled, err
}

// runClose runs close_commit.lua in mode: the decision, and when the
// close was applied (0 when not known).
func (s *Store) runClose(ctx context.Context, uid, id string, deadlineMS int64, keep time.Duration, mode closeMode) (string, int64, error) {
	reply, err := closeCommitScript.Run(ctx, s.rdb, closeKeys{Renewed: s.ks.RenewedKey(uid), Close: s.ks.CloseKey(uid, id), CloseAt: s.ks.CloseAtKey(uid, id)},
		deadlineMS, keep.Milliseconds(), string(mode)).StringSlice()
	if err != nil {
		return "", 0, fmt.Errorf("decide close stage %s of %q: %w", id, uid, err)
	}
	if len(reply) != 2 {
		return "", 0, fmt.Errorf("decide close stage %s of %q: %w: %q", id, uid, errReply, reply)
	}
	got := reply[0]
	var at int64
	if reply[1] != "" {
		if at, err = strconv.ParseInt(reply[1], 10, 64); err != nil || at <= 0 {
			return "", 0, fmt.Errorf("decide close stage %s of %q: %w: applied at %q", id, uid, errReply, reply[1])
		}
	}
	switch got {
	case closeApplied, closeCancelled:
		return got, at, nil
	case "":
		if mode == closeCancelOnly {
			return got, 0, nil
		}
	}
	return "", 0, fmt.Errorf("decide close stage %s of %q: %w: %q", id, uid, errReply, got)
}

// CloseAppliedAt returns when uid's close stage guide id was decided
// applied (see CommitClose), Unix ms by Redis's clock: when the chat
// closed. 0 when not known: not decided, cancelled, or decided by a
// gateway before the time was kept.
func (s *Store) CloseAppliedAt(ctx context.Context, uid, id string) (int64, error) {
	ms, err := s.rdb.Get(ctx, s.ks.CloseAtKey(uid, id)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("when the close stage %s of %q was applied: %w", id, uid, err)
	}
	return ms, nil
}
