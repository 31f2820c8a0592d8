package timeline

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stillthere/stillthere/pkg/session"
)

// TestAttack26OneMalformedEntryHidesTheTimeline proves that one stored
// element without the "<Redis ms> " prefix (written by another version
// of the entry format during a rolling deploy, or by hand) makes the
// whole timeline unreadable: Read fails and the endpoint answers 503 for
// that user until the element is trimmed away or the list expires, 24h
// after its last entry. Read's own rule for an entry that does not
// decode is "shown, not hidden, and the rest still read"; the same
// should hold for one whose time does not parse. (TestReadSkipsOld
// asserts today's behaviour, the error.)
func TestAttack26OneMalformedEntryHidesTheTimeline(t *testing.T) {
	store, rdb := newStore(t)
	ctx := context.Background()
	recordAll(t, store, session.TimelineBounds{}, record{uid: "fay", e: Entry{Kind: KindLapse, Stage: 1}})
	rdb.RPush(ctx, store.Keyspace().TimelineKey("fay"), `{"service":"gateway","kind":"start"}`)
	recordAll(t, store, session.TimelineBounds{}, record{uid: "fay", e: Entry{Kind: KindProduced, Stage: 1}})

	got, err := Read(ctx, store, "fay", 0)
	if err != nil {
		t.Errorf("Read: %v; want the two entries and the malformed one shown as unreadable", err)
	} else if len(got) != 3 || got[0].Kind != KindLapse || got[1].Kind != KindUnreadable || got[2].Kind != KindProduced {
		t.Errorf("Read = %+v; want lapse, unreadable, produced", got)
	}

	const secret = "ops-secret-ops-secret-ops-secret-0123"
	mux := http.NewServeMux()
	mux.Handle(Path, Handler(store, secret, 0))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/v1/users/fay/timeline", nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("endpoint answered %d for a timeline with one malformed entry, want 200", resp.StatusCode)
	}
}
