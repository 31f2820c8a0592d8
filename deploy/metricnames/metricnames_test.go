package metricnames

import (
	"slices"
	"testing"
)

func TestDeclared(t *testing.T) {
	got, err := Declared("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		"stillthere_gateway_connections",            // a gauge
		"stillthere_listener_held_total",            // a counter vector
		"stillthere_gateway_renewal_seconds_bucket", // a histogram's series
		"stillthere_consumer_deadline_to_delivery_seconds_count",
	} {
		if !got[name] {
			t.Errorf("%s is not among the declared series", name)
		}
	}
	if got["stillthere_listener_held_total_bucket"] {
		t.Error("a counter got histogram series")
	}
}

func TestReferenced(t *testing.T) {
	expr := `sum(rate(stillthere_a_total{x="y"}[5m])) / sum(rate(stillthere_b_count[5m]))`
	names, ends := Referenced(expr)
	if want := []string{"stillthere_a_total", "stillthere_b_count"}; !slices.Equal(names, want) {
		t.Fatalf("names = %q, want %q", names, want)
	}
	if expr[ends[0]] != '{' || expr[ends[1]] != '[' {
		t.Errorf("ends = %v point at %q and %q", ends, expr[ends[0]], expr[ends[1]])
	}
}
