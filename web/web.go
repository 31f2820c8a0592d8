// Package web is the browser side of stillthere: the JavaScript client
// library (client/, published to npm on its own) and the demo chat page
// built on it (demo/). The gateway serves the page, with the library
// beside it, only when its demo-page setting is on; the dev stack turns it
// on. Tests of both, in Node and in headless Chromium, are in test/ and
// client/test/, against the stack that teststack/ runs.
package web

import (
	"embed"
	"net/http"
	"strings"
)

//go:embed client/stillthere.js demo/index.html demo/demo.js demo/demo.css
var files embed.FS

// demoFiles maps the names the page is served under to the embedded
// files: the page imports the library from beside itself.
var demoFiles = map[string]struct{ path, contentType string }{
	"":              {"demo/index.html", "text/html; charset=utf-8"},
	"index.html":    {"demo/index.html", "text/html; charset=utf-8"},
	"demo.js":       {"demo/demo.js", "text/javascript; charset=utf-8"},
	"demo.css":      {"demo/demo.css", "text/css; charset=utf-8"},
	"stillthere.js": {"client/stillthere.js", "text/javascript; charset=utf-8"},
}

// demoPolicy lets the page load only its own files and open WebSockets to
// the host that served it ('self' covers ws: and wss: of the same host),
// and an empty data: icon, so that the browser asks for no favicon.
// The page takes its token from the URL's fragment, which the browser
// never sends: it is neither in a request nor in a referrer.
const demoPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Demo serves the demo page's files by their names, the request path
// with the page's prefix stripped ("" and "index.html" are the page).
// Anything else is not found.
func Demo() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := demoFiles[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		b, err := files.ReadFile(f.path)
		if err != nil {
			http.Error(w, "demo page unreadable", http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", f.contentType)
		h.Set("Content-Security-Policy", demoPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// A page for trying things: always the version this binary holds.
		h.Set("Cache-Control", "no-cache")
		if r.Method == http.MethodHead {
			return
		}
		w.Write(b)
	})
}
