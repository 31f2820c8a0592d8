package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/activity"
)

// TestAttackAFResentBatchNotStale: the contract says a batch sent again
// is harmless because "the events applied the first time are stale the
// second" (and the answer's `stale` counts them). A platform that got a
// 503 sends its batch of one active event, with at_ms, again: the real
// store applies it a second time (it is not older than the renewal it
// made, only as old), with a fresh jitter drawn by the endpoint, and the
// answer says applied 1, stale 0. The harm, shown in the session
// package's TestAttackAFReappliedActiveRestartsGuidedSilence: applied
// again after its silence was guided, within the jitter, it cancels the
// silence's stages and starts it over from the same at_ms.
func TestAttackAFResentBatchNotStale(t *testing.T) {
	gw := startGateway(t, func(c *Config) { c.ActivitySecret = activitySecret })
	at := time.Now().Add(-time.Second).UnixMilli()
	body := events(fmt.Sprintf(`{"uid":"attackaf-resent","kind":"active","at_ms":%d}`, at))
	send := func() activity.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+gw.PushAddr().String()+activity.Path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+activitySecret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out activity.Response
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
			t.Fatalf("%s %s", resp.Status, raw)
		}
		return out
	}
	if first := send(); first.Applied != 1 {
		t.Fatalf("first send: %+v", first)
	}
	if again := send(); again.Stale != 1 || again.Applied != 0 {
		t.Fatalf("the same batch sent again answered %+v, want applied 0, stale 1: the event (at_ms %d) was applied a second time", again, at)
	}
}
