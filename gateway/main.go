// Command gateway is stillthere's WebSocket edge: clients connect with a
// JWT and renew their session with app-level pings; the guide consumer
// pushes guides through its internal listener. Run with -h for settings.
//
// "gateway policy show|set ..." shows or changes the per-segment timeout
// policy that every gateway follows; "gateway activity-feed show|forget"
// shows or deletes the activity feed's watermark; "gateway timeline
// <uid>" prints what stillthere decided about one user and why;
// "gateway canary" runs synthetic users against a deployment and exports
// its promise as metrics (package canary).
package main

import (
	"os"

	"github.com/stillthere/stillthere/pkg/activityfeed"
	"github.com/stillthere/stillthere/pkg/canary"
	"github.com/stillthere/stillthere/pkg/daemon"
	"github.com/stillthere/stillthere/pkg/gateway"
	"github.com/stillthere/stillthere/pkg/policy"
	"github.com/stillthere/stillthere/pkg/timeline"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "policy" {
		daemon.Tool("gateway policy", os.Args[2:], policy.Command)
	}
	if len(os.Args) > 1 && os.Args[1] == "activity-feed" {
		daemon.Tool("gateway activity-feed", os.Args[2:], activityfeed.Command)
	}
	if len(os.Args) > 1 && os.Args[1] == "timeline" {
		daemon.Tool("gateway timeline", os.Args[2:], timeline.Command)
	}
	if len(os.Args) > 1 && os.Args[1] == "canary" {
		daemon.Service("gateway canary", 100, os.Args[2:], canary.LoadConfig, canary.Open)
		return
	}
	daemon.Main("gateway", gateway.GCPercent, gateway.LoadConfig, gateway.Open)
}
