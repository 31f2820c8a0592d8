// Command expiry-listener finds sessions whose deadline passed, by sweeping
// the deadline index and listening to Redis expired events, and produces
// one timeout event each to Kafka. Run with -h for settings.
package main

import (
	"github.com/stillthere/stillthere/pkg/daemon"
	"github.com/stillthere/stillthere/pkg/expiry"
)

func main() { daemon.Main("expiry-listener", expiry.GCPercent, expiry.LoadConfig, expiry.Open) }
