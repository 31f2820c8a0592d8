package session

import (
	"testing"
	"time"
)

// TestRouteWriteSaysInbox: a route write says whether the user's inbox
// holds guides, so that a connect that finds it empty skips its take. A
// keep with a route check read before a connect that raised the count is
// refused ("route again"); keeps the check cannot see are offered to the
// connection by the gateway that keeps (pkg/gateway, TestAttack29*).
func TestRouteWriteSaysInbox(t *testing.T) {
	s, ctx := newStore(t)
	write := func(uid string, n int) RouteResult {
		t.Helper()
		res := s.WriteRoutes(ctx, "gw-a", []RouteCount{{UID: uid, Count: n}}, time.Hour, nil)[0]
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		return res
	}
	keep := func(uid string, routes map[string]string) int {
		t.Helper()
		n, err := s.KeepGuide(ctx, uid, Keep{Entry: []byte(`{"id":"g1","uid":"` + uid + `","text":"Still there?"}`),
			MaxAge: time.Hour, Cap: 5, TTL: time.Hour, CheckRoute: true, Routes: routes})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	if res := write("empty", 1); res.Inbox || res.Left != 1 {
		t.Errorf("connect with no inbox: %+v, want Left 1 and no inbox", res)
	}

	// Kept while the user was connected nowhere, then the connect.
	if n := keep("kept", nil); n != KeptQueued {
		t.Fatalf("keep for a user connected nowhere = %d, want kept", n)
	}
	if res := write("kept", 1); !res.Inbox {
		t.Errorf("connect after a guide was kept: %+v, want the inbox flagged", res)
	}

	// A keeper that read the route before the connect's write keeps
	// nothing after it: the inbox the write saw empty stays empty.
	if res := write("late", 1); res.Inbox {
		t.Fatalf("connect: %+v, want no inbox", res)
	}
	if n := keep("late", nil); n != KeptRouteChanged {
		t.Errorf("keep with a route read before the connect = %d, want %d (route again)", n, KeptRouteChanged)
	}
	if res := write("late", 1); res.Inbox {
		t.Errorf("refresh after the refused keep: %+v, want no inbox", res)
	}

	// An ending write says it too (the close's guide may wait there).
	keep("gone", nil)
	write("gone", 1)
	if res := write("gone", 0); !res.Inbox || res.Left != 0 {
		t.Errorf("last close with a guide kept: %+v, want Left 0 and the inbox flagged", res)
	}
}
