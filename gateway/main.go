// Command gateway is stillthere's WebSocket edge: clients connect with a
// JWT and renew their session with app-level pings; the guide consumer
// pushes guides through its internal listener. Run with -h for settings.
package main

import (
	"github.com/stillthere/stillthere/pkg/daemon"
	"github.com/stillthere/stillthere/pkg/gateway"
)

func main() { daemon.Main("gateway", gateway.LoadConfig, gateway.Run) }
