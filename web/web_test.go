package web

import (
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDemoServesItsFiles: each of the page's files, with its type; no
// other file of the package.
func TestDemoServesItsFiles(t *testing.T) {
	for _, tt := range []struct {
		path, contentType string
		status            int
	}{
		{"", "text/html", http.StatusOK},
		{"index.html", "text/html", http.StatusOK},
		{"demo.js", "text/javascript", http.StatusOK},
		{"demo.css", "text/css", http.StatusOK},
		{"stillthere.js", "text/javascript", http.StatusOK},
		{"web.go", "", http.StatusNotFound},
		{"client/stillthere.js", "", http.StatusNotFound},
		{"demo/index.html", "", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		Demo().ServeHTTP(rec, httptest.NewRequest("GET", "/"+tt.path, nil))
		if rec.Code != tt.status {
			t.Errorf("GET %q: %d, want %d", tt.path, rec.Code, tt.status)
			continue
		}
		if tt.status != http.StatusOK {
			continue
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, tt.contentType) {
			t.Errorf("GET %q: Content-Type %q, want %s", tt.path, ct, tt.contentType)
		}
		if rec.Body.Len() == 0 {
			t.Errorf("GET %q: empty", tt.path)
		}
	}
}

// TestDemoPageLoadsOnlyServedFiles: every file the page and its script
// load is one Demo serves, so a renamed file cannot break the page
// unnoticed.
func TestDemoPageLoadsOnlyServedFiles(t *testing.T) {
	refs := map[string]*regexp.Regexp{
		"demo/index.html": regexp.MustCompile(`(?:src|href)="([^"]+)"`),
		"demo/demo.js":    regexp.MustCompile(`(?m)^import .* from '([^']+)';`),
	}
	for file, re := range refs {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		found := re.FindAllStringSubmatch(string(b), -1)
		if len(found) == 0 {
			t.Errorf("%s loads nothing", file)
		}
		for _, m := range found {
			if strings.HasPrefix(m[1], "data:") {
				continue
			}
			name := strings.TrimPrefix(m[1], "./")
			if _, ok := demoFiles[name]; !ok {
				t.Errorf("%s loads %q, which the demo does not serve", file, m[1])
			}
		}
	}
}
