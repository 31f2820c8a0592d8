package main

// serveGoroutine reads c on a goroutine of its own, parked in
// ReadMessage while the connection idles, and hands c each frame, then
// its end.
func serveGoroutine(c *conn) {
	go func() {
		for {
			typ, data, err := c.ws.ReadMessage()
			if err != nil {
				c.Closed(err)
				return
			}
			if !c.Message(typ, data) {
				c.ws.Close()
			}
		}
	}()
}
