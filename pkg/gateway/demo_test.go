package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestDemoPageOnlyWhenTurnedOn: a production gateway serves no page; with
// demo-page on, the public listener serves the page and the client
// library beside it, and the WebSocket as before.
func TestDemoPageOnlyWhenTurnedOn(t *testing.T) {
	for _, tt := range []struct {
		name string
		on   bool
		want map[string]int
	}{
		{"off by default", false, map[string]int{
			"/demo/":              http.StatusNotFound,
			"/demo/stillthere.js": http.StatusNotFound,
			"/v1/ws":              http.StatusUnauthorized,
		}},
		{"on", true, map[string]int{
			"/demo/":              http.StatusOK,
			"/demo/index.html":    http.StatusOK,
			"/demo/demo.js":       http.StatusOK,
			"/demo/demo.css":      http.StatusOK,
			"/demo/stillthere.js": http.StatusOK,
			"/demo/web.go":        http.StatusNotFound,
			"/demo/../go.mod":     http.StatusNotFound,
			"/v1/ws":              http.StatusUnauthorized,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tg := startGateway(t, func(c *Config) { c.DemoPage = tt.on })
			for path, want := range tt.want {
				resp, err := http.Get("http://" + tg.PublicAddr().String() + path)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("GET %s: %s, want %d", path, resp.Status, want)
					continue
				}
				if want != http.StatusOK {
					continue
				}
				if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") {
					t.Errorf("GET %s: Content-Security-Policy %q, want one that limits connections to this host", path, csp)
				}
				if path == "/demo/stillthere.js" && !strings.Contains(string(body), "export class StillThere") {
					t.Errorf("GET %s: not the client library", path)
				}
			}
		})
	}
}

func TestDemoPageSetting(t *testing.T) {
	for _, tt := range []struct {
		value string // of STILLTHERE_DEMO_PAGE; "" leaves it unset
		want  bool
		err   string
	}{
		{"", false, ""},
		{"false", false, ""},
		{"true", true, ""},
		{"on", false, `STILLTHERE_DEMO_PAGE="on"`},
	} {
		env := map[string]string{"STILLTHERE_TOKEN_SECRET": tokenSecret, "STILLTHERE_PUSH_SECRET": pushSecret}
		if tt.value != "" {
			env["STILLTHERE_DEMO_PAGE"] = tt.value
		}
		c, err := LoadConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("STILLTHERE_DEMO_PAGE=%q: %v, want an error naming %s", tt.value, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("STILLTHERE_DEMO_PAGE=%q: %v", tt.value, err)
		case tt.err == "" && c.DemoPage != tt.want:
			t.Errorf("STILLTHERE_DEMO_PAGE=%q: DemoPage %v, want %v", tt.value, c.DemoPage, tt.want)
		}
	}
}

// TestDemoBotOnlyBesideThePage: a bot handler (only the dev stack gives
// one) answers POST /demo/bot when the page is served, and is not reached
// without the page; without a bot the page is served alone.
func TestDemoBotOnlyBesideThePage(t *testing.T) {
	bot := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	for _, tt := range []struct {
		name string
		page bool
		bot  http.Handler
		want int
	}{
		{"page and bot", true, bot, http.StatusTeapot},
		{"page without bot", true, nil, http.StatusMethodNotAllowed},
		{"bot without page", false, bot, http.StatusNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tg := startGateway(t, func(c *Config) { c.DemoPage, c.DemoBot = tt.page, tt.bot })
			resp, err := http.Post("http://"+tg.PublicAddr().String()+"/demo/bot", "application/json", strings.NewReader(`{"text":"hi"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("POST /demo/bot: %s, want %d", resp.Status, tt.want)
			}
		})
	}
}
