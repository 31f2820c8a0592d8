package main

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stillthere/stillthere/pkg/chatsim"
	"github.com/stillthere/stillthere/pkg/token"
)

// TestDevicesGetFreshTokens: a run longer than a token's life must not
// cut every device off as its token runs out (an hour-long run once did,
// and the checker took the refused pings for silences): each period,
// every device's later dials carry a fresh token.
func TestDevicesGetFreshTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		secret := "test-secret-of-32-bytes-or-more!!"
		first, err := chatsim.Token([]byte(secret), "ws-000", "")
		if err != nil {
			t.Fatal(err)
		}
		d := &device{chat: &chatsim.User{UID: "ws-000", Token: first}}
		c := &crowd{r: &rig{tokenSecret: secret}, users: []*user{{uid: "ws-000", devices: []*device{d}}}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go c.refreshTokens(ctx, 20*time.Minute)

		time.Sleep(70 * time.Minute) // the fake clock: past the first token's hour
		synctest.Wait()
		v, err := token.NewVerifier([]byte(secret), token.Rules{})
		if err != nil {
			t.Fatal(err)
		}
		claims, err := v.Verify(d.chat.CurrentToken())
		if err != nil {
			t.Fatalf("the device's token after 70 min: %v", err)
		}
		if claims.UID != "ws-000" || !claims.Expires.After(time.Now().Add(45*time.Minute)) {
			t.Errorf("the device's token after 70 min: %+v, want ws-000's, lasting 45 min more", claims)
		}
	})
}
