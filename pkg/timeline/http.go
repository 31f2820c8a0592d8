package timeline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/stillthere/stillthere/pkg/admin"
	"github.com/stillthere/stillthere/pkg/push"
	"github.com/stillthere/stillthere/pkg/session"
	"github.com/stillthere/stillthere/pkg/userid"
)

// Path is the timeline endpoint's route on the gateway's internal
// listener.
const Path = "GET /v1/users/{uid}/timeline"

// CheckSecret applies the secret rule to the gateway's ops-secret: empty
// (no timeline endpoint), or at least push.MinSecretLen bytes and none of
// the others, so that holding one grants nothing else.
func CheckSecret(secret string, others ...string) error {
	switch {
	case secret == "":
		return nil
	case len(secret) < push.MinSecretLen:
		return fmt.Errorf("ops-secret: %d bytes, want at least %d (or empty: no timeline endpoint)", len(secret), push.MinSecretLen)
	}
	for _, o := range others {
		if o != "" && o == secret {
			return errors.New("ops-secret: the same as another secret of the gateway, want one of its own")
		}
	}
	return nil
}

// Answer is the endpoint's answer: the user's timeline, oldest first.
type Answer struct {
	UID     string  `json:"uid"`
	Entries []Entry `json:"entries"`
}

// Handler serves Path: uid's timeline, for a caller holding secret as its
// bearer token. An unknown uid has an empty timeline; a malformed one is
// refused with 400.
func Handler(store *session.Store, secret string, keep time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !push.Authorized(r, secret) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="stillthere"`)
			admin.WriteError(w, http.StatusUnauthorized, "missing or wrong bearer token (ops-secret)")
			return
		}
		uid := r.PathValue("uid")
		if !userid.Valid(uid) {
			admin.WriteError(w, http.StatusBadRequest, fmt.Sprintf("uid %q: not a valid user id", uid))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		entries, err := View(ctx, store, uid, keep)
		if err != nil {
			admin.WriteError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		admin.WriteJSON(w, http.StatusOK, Answer{UID: uid, Entries: entries})
	})
}
