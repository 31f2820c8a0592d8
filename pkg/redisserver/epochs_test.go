package redisserver

import (
	"strings"
	"testing"
)

func TestNodeEpochs(t *testing.T) {
	text := "aaa 127.0.0.1:1@11 myself,master - 0 0 2 connected 0-5460\n" +
		"bbb 127.0.0.1:2@12 master - 0 1 3 connected 5461-10921\n" +
		"ccc 127.0.0.1:3@13 slave aaa 0 1 2 connected\n" +
		"short line\n"
	got := nodeEpochs(text)
	want := map[string]int64{"aaa": 2, "bbb": 3, "ccc": 2}
	if len(got) != len(want) {
		t.Fatalf("nodeEpochs = %v, want %v", got, want)
	}
	for id, e := range want {
		if got[id] != e {
			t.Errorf("nodeEpochs[%s] = %d, want %d", id, got[id], e)
		}
	}
}

func TestSettledEpochs(t *testing.T) {
	masters := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name  string
		views []map[string]int64
		want  string // "" for settled
	}{
		{"settled", []map[string]int64{
			{"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 1, "c": 0},
		}, ""},
		{"a replica agrees too", []map[string]int64{
			{"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 1, "c": 0, "r": 2},
		}, ""},
		{"a collision not yet resolved", []map[string]int64{
			{"a": 1, "b": 1, "c": 0}, {"a": 1, "b": 1, "c": 0}, {"a": 1, "b": 1, "c": 0},
		}, "share config epoch 1"},
		{"a master has not heard of another's new epoch", []map[string]int64{
			{"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 1, "c": 3}, {"a": 2, "b": 1, "c": 3},
		}, "node 0 sees master 2 at config epoch 0"},
		{"a replica has not heard", []map[string]int64{
			{"a": 2, "b": 3, "c": 0}, {"a": 2, "b": 3, "c": 0}, {"a": 2, "b": 3, "c": 0}, {"a": 2, "b": 1, "c": 0},
		}, "node 3 sees master 1"},
		{"a master not yet known", []map[string]int64{
			{"a": 2, "b": 1}, {"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 1, "c": 0},
		}, "known: false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := settledEpochs(masters, tc.views)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("settledEpochs = %v, want settled", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("settledEpochs = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestOutranks(t *testing.T) {
	for _, tc := range []struct {
		epochs map[string]int64
		ok     bool
	}{
		{map[string]int64{"t": 3, "s": 2, "o": 0}, true},
		{map[string]int64{"t": 2, "s": 3, "o": 0}, false},
		{map[string]int64{"t": 2, "s": 2, "o": 0}, false},
		{map[string]int64{"t": 0}, true},
	} {
		if err := outranks("t", tc.epochs); (err == nil) != tc.ok {
			t.Errorf("outranks(t, %v) = %v, want ok %t", tc.epochs, err, tc.ok)
		}
	}
}
