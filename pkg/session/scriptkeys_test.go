package session

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// On a Redis Cluster a script may touch only the keys it declares in
// KEYS: the node checks the declared keys before the script runs, and
// sends the client elsewhere (ASK, MOVED) or back (TRYAGAIN) when their
// slot is moving and they are not all in one place. A key a script builds
// from ARGV, or from a value it read, escapes that check: mid-migration
// the script reads it where it no longer is, and a route or a session
// that is there looks gone. These tests read every script of the module
// and fail on a Redis command whose key is anything but KEYS[...].

// keyless are the commands our scripts call that take no key.
var keyless = map[string]bool{"TIME": true, "INFO": true, "CLUSTER": true}

// allKeys are the commands whose every argument is a key.
var allKeys = map[string]bool{"DEL": true, "EXISTS": true, "UNLINK": true, "MGET": true, "TOUCH": true}

// firstKey are the commands whose first argument is their one key.
var firstKey = map[string]bool{
	"GET": true, "SET": true, "INCRBY": true, "EXPIRE": true, "PEXPIRE": true, "PTTL": true,
	"HGET": true, "HSET": true, "HSETNX": true, "HDEL": true, "HEXISTS": true, "HKEYS": true, "HVALS": true, "HGETALL": true, "HMGET": true,
	"ZADD": true, "ZREM": true, "ZSCORE": true, "ZRANGE": true, "ZRANGEBYSCORE": true,
	"ZREMRANGEBYSCORE": true, "ZCARD": true,
	"LPUSH": true, "RPUSH": true, "LTRIM": true, "LRANGE": true, "LREM": true,
}

var declaredKey = regexp.MustCompile(`^KEYS\[[^\[\]]+\]$`)

// undeclaredKeys lists the Redis calls in src whose keys are not
// KEYS[...], and the calls it cannot read.
func undeclaredKeys(src string) []string {
	code := stripLua(src)
	var bad []string
	for i := 0; ; {
		j := strings.Index(code[i:], "redis.")
		if j < 0 {
			return bad
		}
		at := i + j
		i = at + len("redis.")
		name := leadingIdent(code[i:])
		if name != "call" && name != "pcall" {
			continue
		}
		i += len(name)
		rest := strings.TrimLeft(code[i:], " \t\n")
		var args []string
		switch {
		case strings.HasPrefix(rest, "("):
			args = splitArgs(rest[1:])
		case strings.HasPrefix(rest, ",") && strings.HasSuffix(strings.TrimRight(code[:at], " \t\n"), "pcall("):
			// pcall(redis.call, cmd, ...)
			args = splitArgs(rest[1:])
		default:
			bad = append(bad, "redis."+name+" used other than as a call: "+snippet(code[at:]))
			continue
		}
		if args == nil {
			bad = append(bad, "unreadable call: "+snippet(code[at:]))
			continue
		}
		if p := checkCall(args); p != "" {
			bad = append(bad, p+": "+snippet(code[at:]))
		}
	}
}

// checkCall checks one call's arguments, the command first.
func checkCall(args []string) string {
	cmd, err := strconv.Unquote(luaQuoted(args[0]))
	if err != nil {
		return "command is not a literal (" + args[0] + ")"
	}
	cmd = strings.ToUpper(cmd)
	var keys []string
	switch {
	case keyless[cmd]:
		return ""
	case allKeys[cmd]:
		keys = args[1:]
	case firstKey[cmd]:
		if len(args) < 2 {
			return cmd + " without a key"
		}
		keys = args[1:2]
	default:
		return "command " + cmd + " unknown to this check: add it to keyless, allKeys or firstKey"
	}
	for _, k := range keys {
		if !declaredKey.MatchString(k) {
			return cmd + " on key " + k + ", not one of KEYS"
		}
	}
	return ""
}

// luaQuoted turns a Lua string literal into a Go one.
func luaQuoted(s string) string {
	if len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'' {
		return strconv.Quote(s[1 : len(s)-1])
	}
	return s
}

func leadingIdent(s string) string {
	n := 0
	for n < len(s) && (s[n] == '_' || 'a' <= s[n] && s[n] <= 'z' || 'A' <= s[n] && s[n] <= 'Z' || '0' <= s[n] && s[n] <= '9') {
		n++
	}
	return s[:n]
}

// splitArgs splits the arguments of a call whose opening parenthesis
// came just before s, at top-level commas, up to its closing one. It
// returns nil if the call does not close.
func splitArgs(s string) []string {
	var args []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '"':
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				return nil
			}
			i += end + 1
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			if depth == 0 {
				return append(args, strings.TrimSpace(s[start:i]))
			}
			depth--
		case ',':
			if depth == 0 {
				args = append(args, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return nil
}

// stripLua removes comments, keeping strings (our scripts have no
// escaped quotes or long brackets in them).
func stripLua(src string) string {
	var b strings.Builder
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '\'' || c == '"':
			end := strings.IndexByte(src[i+1:], c)
			if end < 0 {
				b.WriteString(src[i:])
				return b.String()
			}
			b.WriteString(src[i : i+end+2])
			i += end + 1
		case c == '-' && strings.HasPrefix(src[i:], "--"):
			nl := strings.IndexByte(src[i:], '\n')
			if nl < 0 {
				return b.String()
			}
			i += nl - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func snippet(s string) string {
	if nl := strings.IndexByte(s, '\n'); nl >= 0 {
		s = s[:nl]
	}
	return strings.TrimSpace(s)
}

// TestUndeclaredKeys runs the check on the cases of testdata/keycheck,
// each a Lua file whose first line says how many problems it holds:
// "-- <case>: <n> problem(s)".
func TestUndeclaredKeys(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "keycheck", "*.lua"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 14 {
		t.Fatalf("found %d cases in testdata/keycheck, want 14 or more", len(files))
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		head, lua, _ := strings.Cut(string(src), "\n")
		name, want, ok := strings.Cut(strings.TrimPrefix(head, "-- "), ": ")
		bad, err := strconv.Atoi(strings.TrimSuffix(want, " problem(s)"))
		if !ok || err != nil {
			t.Fatalf("%s: first line %q, want \"-- <case>: <n> problem(s)\"", f, head)
		}
		t.Run(name, func(t *testing.T) {
			if got := undeclaredKeys(lua); len(got) != bad {
				t.Errorf("undeclaredKeys(%q) = %q, want %d problem(s)", lua, got, bad)
			}
		})
	}
}

// TestScriptsDeclareTheirKeys reads every script of the model, as loaded
// (lua/ with its prelude, key table, vocabulary and codecs), and checks
// that each key it touches is one of KEYS. It also checks that no Go file
// of the module hands Redis a script of its own: every script is a file
// of lua/, loaded by newScript.
func TestScriptsDeclareTheirKeys(t *testing.T) {
	for name, src := range loaded {
		for _, p := range undeclaredKeys(src) {
			t.Errorf("lua/%s.lua: %s", name, p)
		}
	}
	// The scripts of the session, the gateway, the listener and the
	// consumer: fewer means this test no longer finds them.
	if len(loaded) < 20 {
		t.Fatalf("found %d scripts, want every one of the module's (20 or more)", len(loaded))
	}
	files, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "lua/"), ".lua")
		if _, ok := loaded[name]; !ok && !loadedLibs[name] {
			t.Errorf("%s is no script's: load it with newScript, or remove it", f)
		}
	}

	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if rel == filepath.Join("pkg", "session", "scripts.go") {
			return nil
		}
		for _, line := range newScriptCalls(t, path) {
			t.Errorf("%s:%d: a script outside lua/: make it a file there, loaded by newScript", rel, line)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// newScriptCalls returns the lines of a Go file that call redis.NewScript.
func newScriptCalls(t *testing.T, path string) []int {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lines []int
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewScript" {
			lines = append(lines, fset.Position(call.Pos()).Line)
		}
		return true
	})
	return lines
}

// testdataLua is the Lua of testdata/<name>.lua.
func testdataLua(t *testing.T, name string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", name+".lua"))
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// mustReadFile is a test file's content, for a package-level script.
func mustReadFile(path string) string {
	src, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(src)
}
