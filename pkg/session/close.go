package session

import (
	"context"
	"fmt"
	"time"
)

// A close stage's guide closes every connection that writes it, and a
// connection that takes it late (a gateway paused mid-push, a guide
// routed to an instance that reads it late, one held until a
// connection's first ping) may find its user came back meanwhile. Whether
// the close is applied is decided once, for every connection on every
// instance, by the first about to write it (CommitClose): cancelled if
// the user renewed after the silence's deadline, else applied. A
// connection that finds it applied writes it, however late, so that no
// device of a chat that was closed goes untold; one that finds it
// cancelled drops it, and so does every other.

// closeCommitScript decides a close stage's guide once: close_commit.lua.
var closeCommitScript = newScript[closeKeys]("close_commit", closeOutcomes{Applied: closeApplied, Cancelled: closeCancelled}, nil)

const (
	closeApplied   = "applied"
	closeCancelled = "cancelled"
)

// closeOutcomes are close_commit.lua's answers.
type closeOutcomes struct{ Applied, Cancelled string }

// CommitClose decides whether uid's close stage guide id, of the silence
// whose deadline was deadlineMS, is applied: the first call decides, by
// whether the user renewed (or ended) their session after the deadline,
// and the decision is kept for keep; every later call gets it.
func (s *Store) CommitClose(ctx context.Context, uid, id string, deadlineMS int64, keep time.Duration) (applied bool, err error) {
	got, err := closeCommitScript.Run(ctx, s.rdb, closeKeys{Renewed: s.ks.RenewedKey(uid), Close: s.ks.CloseKey(uid, id)},
		deadlineMS, keep.Milliseconds()).Text()
	if err != nil {
		return false, fmt.Errorf("commit close stage %s of %q: %w", id, uid, err)
	}
	switch got {
	case closeApplied:
		return true, nil
	case closeCancelled:
		return false, nil
	}
	return false, fmt.Errorf("commit close stage %s of %q: %w: %q", id, uid, errReply, got)
}
