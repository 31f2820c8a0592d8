package grafana

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stillthere/stillthere/deploy/metricnames"
)

const (
	datasourceUID = "${datasource}"
	// scope is the label matcher every query carries, the dashboard's
	// namespace variable.
	scope = `namespace=~"$namespace"`
	// gridWidth is Grafana's: 24 columns.
	gridWidth = 24
)

type dashboard struct {
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	ID         int         `json:"id"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Panels  []json.RawMessage `json:"panels"` // a collapsed row's
	Targets []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
}

// rowSeries are series each row must show, by row title.
var rowSeries = map[string][]string{
	"Inactivity stages": {
		"stillthere_consumer_stage_guides_total",
		"stillthere_consumer_deadline_to_delivery_seconds_bucket",
		"stillthere_gateway_closed_inactive_total",
	},
	"Activity": {
		"stillthere_activity_feed_lag_seconds",
		"stillthere_activity_feed_records_total",
		"stillthere_gateway_activity_events_total",
		"stillthere_listener_held_total",
	},
	"Canary": {
		"stillthere_canary_stages_total",
		"stillthere_canary_stage_lateness_seconds_bucket",
		"stillthere_canary_silences_total",
		"stillthere_canary_signals_total",
	},
	"Outages": {
		"stillthere_listener_mass_expiry_brake",
		"stillthere_listener_gateway_fleet_down",
		"stillthere_listener_held_total",
		"stillthere_listener_blind_intervals_total",
		"stillthere_gateway_heartbeats_total",
		"stillthere_gateway_resynced_total",
	},
}

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("stillthere.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("stillthere.json: %v", err)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, b, "", "  "); err != nil || !bytes.Equal(indented.Bytes(), b) {
		t.Error("stillthere.json is not indented by two spaces as Grafana exports it (python3 -m json.tool --indent 2)")
	}
	if d.UID == "" || len(d.Panels) == 0 {
		t.Fatal("no uid or no panels")
	}
	declared, err := metricnames.Declared("../..")
	if err != nil {
		t.Fatal(err)
	}

	ids := map[int]string{}
	var row string
	shown := map[string][]string{} // series by row
	for i, p := range d.Panels {
		if prev, dup := ids[p.ID]; dup || p.ID <= 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > gridWidth {
			t.Errorf("panel %q: gridPos %+v is off the %d-column grid", p.Title, g, gridWidth)
		}
		for _, q := range d.Panels[:i] {
			o := q.GridPos
			if g.X < o.X+o.W && o.X < g.X+g.W && g.Y < o.Y+o.H && o.Y < g.Y+g.H {
				t.Errorf("panels %q and %q overlap", q.Title, p.Title)
			}
		}
		if i > 0 && g.Y < d.Panels[i-1].GridPos.Y {
			t.Errorf("panel %q comes before %q in the file but is placed above it", p.Title, d.Panels[i-1].Title)
		}
		if p.Type == "row" {
			row = p.Title
			if g.W != gridWidth || g.X != 0 || len(p.Panels) > 0 || len(p.Targets) > 0 {
				t.Errorf("row %q: want a full-width, expanded row", p.Title)
			}
			continue
		}
		if row == "" {
			t.Errorf("panel %q is above the first row", p.Title)
		}
		checkPanel(t, p, declared, shown, row)
	}
	for r, want := range rowSeries {
		for _, s := range want {
			if !slices.Contains(shown[r], s) {
				t.Errorf("row %q shows no panel of %s", r, s)
			}
		}
	}
}

func checkPanel(t *testing.T, p panel, declared map[string]bool, shown map[string][]string, row string) {
	t.Helper()
	if p.Datasource == nil || p.Datasource.UID != datasourceUID {
		t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, datasourceUID)
	}
	if len(p.Targets) == 0 {
		t.Errorf("panel %q queries nothing", p.Title)
	}
	refs := map[string]bool{}
	for _, tg := range p.Targets {
		if tg.RefID == "" || refs[tg.RefID] {
			t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
		}
		refs[tg.RefID] = true
		if tg.Datasource == nil || tg.Datasource.UID != datasourceUID {
			t.Errorf("panel %q, query %s: datasource %+v, want uid %s", p.Title, tg.RefID, tg.Datasource, datasourceUID)
		}
		names, ends := metricnames.Referenced(tg.Expr)
		if len(names) == 0 {
			t.Errorf("panel %q, query %s names no stillthere_ series: %q", p.Title, tg.RefID, tg.Expr)
		}
		for i, n := range names {
			if !declared[n] {
				t.Errorf("panel %q: %s is not a series the services publish (pkg/*/metrics.go)", p.Title, n)
			}
			rest := tg.Expr[ends[i]:]
			end := strings.Index(rest, "}")
			if !strings.HasPrefix(rest, "{") || end < 0 || !strings.Contains(rest[:end], scope) {
				t.Errorf("panel %q: %s is not scoped by %s", p.Title, n, scope)
			}
			shown[row] = append(shown[row], n)
		}
	}
}
