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
	"HGET": true, "HSET": true, "HDEL": true, "HEXISTS": true, "HKEYS": true, "HVALS": true, "HGETALL": true,
	"ZADD": true, "ZREM": true, "ZSCORE": true, "ZRANGE": true, "ZRANGEBYSCORE": true,
	"ZREMRANGEBYSCORE": true, "ZCARD": true,
	"LPUSH": true, "LTRIM": true, "LRANGE": true, "LREM": true,
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

func TestUndeclaredKeys(t *testing.T) {
	tests := []struct {
		name, lua string
		bad       int
	}{
		{"declared", `return redis.call('GET', KEYS[1])`, 0},
		{"declared by index", `for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end redis.call("INCRBY", KEYS[#KEYS], 1)`, 0},
		{"keyless", `local t = redis.call('TIME') local ok, c = pcall(redis.call, 'CLUSTER', 'INFO')`, 0},
		{"pcall of a declared key", `local ok, r = pcall(redis.call, 'HKEYS', KEYS[2])`, 0},
		{"member from ARGV", `redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1] .. ':x')`, 0},
		{"comment", "-- redis.call('GET', ARGV[1])\nreturn 1", 0},
		{"key from ARGV", `return redis.call('EXISTS', ARGV[1] .. uid)`, 1},
		{"key from ARGV in pcall", `local ok, r = pcall(redis.call, 'HKEYS', ARGV[3] .. uid)`, 1},
		{"key in a local", `local k = KEYS[1] return redis.call('GET', k)`, 1},
		{"second key of DEL", `redis.call('DEL', KEYS[1], 'other')`, 1},
		{"unknown command", `redis.call('SUNIONSTORE', KEYS[1], KEYS[2])`, 1},
		{"command from a variable", `redis.call(ARGV[1], KEYS[1])`, 1},
		{"aliased", `local call = redis.call return call('GET', ARGV[1])`, 1},
		{"two bad", `redis.call('GET', ARGV[1]) redis.pcall('HGET', 'h', ARGV[2])`, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := undeclaredKeys(tc.lua); len(got) != tc.bad {
				t.Errorf("undeclaredKeys(%q) = %q, want %d problem(s)", tc.lua, got, tc.bad)
			}
		})
	}
}

// TestScriptsDeclareTheirKeys reads every redis.NewScript of the module's
// code and checks that each key it touches is one of KEYS.
func TestScriptsDeclareTheirKeys(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	scripts := 0
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
		for _, s := range scriptsIn(t, path) {
			scripts++
			for _, p := range undeclaredKeys(s.lua) {
				t.Errorf("%s:%d: script %s: %s", rel, s.line, s.name, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The scripts of session, gateway, expiry and guide: fewer means this
	// test no longer finds them.
	if scripts < 20 {
		t.Fatalf("found %d scripts, want every one of the module's (20 or more)", scripts)
	}
}

type foundScript struct {
	name string
	line int
	lua  string
}

// scriptsIn returns the sources given to redis.NewScript in a Go file,
// as literals or as constants of the same file.
func scriptsIn(t *testing.T, path string) []foundScript {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if i < len(vs.Values) {
					if v, ok := stringConst(vs.Values[i], consts); ok {
						consts[n.Name] = v
					}
				}
			}
		}
	}
	var out []foundScript
	var name string
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Names) > 0 {
			name = vs.Names[0].Name
		}
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "NewScript" {
			return true
		}
		pos := fset.Position(call.Pos())
		if len(call.Args) != 1 {
			t.Errorf("%s:%d: NewScript with %d arguments", path, pos.Line, len(call.Args))
			return true
		}
		var lua string
		switch a := call.Args[0].(type) {
		case *ast.BasicLit:
			lua, err = strconv.Unquote(a.Value)
		case *ast.Ident:
			var ok bool
			if lua, ok = consts[a.Name]; !ok {
				t.Errorf("%s:%d: NewScript of %s, not a string constant of this file", path, pos.Line, a.Name)
				return true
			}
		default:
			t.Errorf("%s:%d: NewScript of an expression this test cannot read", path, pos.Line)
			return true
		}
		if err != nil {
			t.Errorf("%s:%d: %v", path, pos.Line, err)
			return true
		}
		out = append(out, foundScript{name: name, line: pos.Line, lua: lua})
		return true
	})
	return out
}

// stringConst is the value of a string literal, a constant declared
// before it in the file, or a sum of them (a script's source that starts
// with functions it shares).
func stringConst(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(e.Value)
		return v, err == nil
	case *ast.Ident:
		v, ok := consts[e.Name]
		return v, ok
	case *ast.BinaryExpr:
		x, ok1 := stringConst(e.X, consts)
		y, ok2 := stringConst(e.Y, consts)
		return x + y, ok1 && ok2 && e.Op == token.ADD
	}
	return "", false
}
