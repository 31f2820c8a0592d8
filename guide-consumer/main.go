// Command guide-consumer reads timeout events as a Kafka consumer group and
// sends each silent user one guide through a circuit breaker. Run with -h
// for settings.
package main

import (
	"github.com/stillthere/stillthere/pkg/daemon"
	"github.com/stillthere/stillthere/pkg/guide"
)

func main() { daemon.Main("guide-consumer", guide.GCPercent, guide.LoadConfig, guide.Open) }
