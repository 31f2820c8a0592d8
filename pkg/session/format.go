package session

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// A format is how one kind of stored value is laid out: fields joined by
// a separator, the last field taking the rest (it may hold the
// separator). Go reads and writes the value through it (encode, decode),
// and each script that does gets Lua functions written from the same
// field list: encode<Name>(f1, ..., fn) and decode<Name>(s), which
// returns the fields, or nil when s is not of the format. So the layout
// of a value is written once, here.
type format struct {
	name   string
	sep    string // one punctuation character
	fields []field
	// optional: the last field may be absent, and the separator before
	// it with it; encode leaves both out when it is empty.
	optional bool
	re       *regexp.Regexp // the format as a Go regexp, which the Lua pattern follows
}

// newFormat is a format of fields joined by sep.
func newFormat(name, sep string, optional bool, fields ...field) format {
	f := format{name: name, sep: sep, fields: fields, optional: optional}
	f.re = f.regexp()
	return f
}

// field is one field of a format. A digits field is one or more decimal
// digits, as a time in ms or a count is stored.
type field struct {
	name   string
	digits bool
}

// encode joins a value's fields.
func (f format) encode(vals ...string) string {
	if len(vals) != len(f.fields) {
		panic(fmt.Sprintf("%s: %d fields, want %d", f.name, len(vals), len(f.fields)))
	}
	if f.optional && vals[len(vals)-1] == "" {
		vals = vals[:len(vals)-1]
	}
	return strings.Join(vals, f.sep)
}

// decode splits a value into its fields; ok is false when v is not of
// the format. An absent optional field is "".
func (f format) decode(v string) (vals []string, ok bool) {
	m := f.re.FindStringSubmatch(v)
	if m == nil {
		return nil, false
	}
	return m[1:], true
}

func (f format) regexp() *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	sep := regexp.QuoteMeta(f.sep)
	for i, fl := range f.fields {
		last := i == len(f.fields)-1
		if i > 0 && !(last && f.optional) {
			b.WriteString(sep)
		}
		switch {
		case last && f.optional:
			b.WriteString("(?:" + sep + "(" + f.goPart(fl, true) + "))?")
		default:
			b.WriteString("(" + f.goPart(fl, last) + ")")
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

func (f format) goPart(fl field, last bool) string {
	switch {
	case fl.digits:
		return "[0-9]+"
	case last:
		return "(?s:.*)"
	}
	return "[^" + regexp.QuoteMeta(f.sep) + "]*"
}

// luaPart is one field's Lua pattern.
func (f format) luaPart(fl field, last bool) string {
	switch {
	case fl.digits:
		return "(%d+)"
	case last:
		return "(.*)"
	}
	return "([^%" + f.sep + "]*)"
}

// lua writes the format's encode<Name> and decode<Name>.
func (f format) lua() string {
	var params []string
	for _, fl := range f.fields {
		params = append(params, fl.name)
	}
	sep := "'" + f.sep + "'"
	var b strings.Builder
	fmt.Fprintf(&b, "local function encode%s(%s)\n", f.name, strings.Join(params, ", "))
	last := params[len(params)-1]
	if f.optional {
		fmt.Fprintf(&b, "  if %s == nil or %s == '' then return %s end\n",
			last, last, strings.Join(params[:len(params)-1], " .. "+sep+" .. "))
	}
	fmt.Fprintf(&b, "  return %s\nend\n", strings.Join(params, " .. "+sep+" .. "))
	var pat strings.Builder
	for i, fl := range f.fields {
		isLast := i == len(f.fields)-1
		if i > 0 && !(isLast && f.optional) {
			pat.WriteString("%" + f.sep)
		}
		if !(isLast && f.optional) {
			pat.WriteString(f.luaPart(fl, isLast))
		}
	}
	fmt.Fprintf(&b, "local function decode%s(s)\n", f.name)
	if f.optional {
		// Lua patterns have no optional group: with the last field, then
		// without it.
		with := pat.String() + "%" + f.sep + f.luaPart(f.fields[len(f.fields)-1], true)
		// Each field a local, not a table unpacked: a grant decodes the
		// session's value on every renewal.
		all := strings.Join(params, ", ")
		fmt.Fprintf(&b, "  local %s = string.match(s, '^%s$')\n", all, with)
		fmt.Fprintf(&b, "  if %s then return %s end\n", params[0], all)
		fmt.Fprintf(&b, "  %s = string.match(s, '^%s$')\n", strings.Join(params[:len(params)-1], ", "), pat.String())
		fmt.Fprintf(&b, "  if %s then return %s, '' end\n  return nil\nend\n", params[0], strings.Join(params[:len(params)-1], ", "))
	} else {
		fmt.Fprintf(&b, "  return string.match(s, '^%s$')\nend\n", pat.String())
	}
	return b.String()
}

// A codec is what a script is loaded with to read or write one kind of
// stored value: its Lua encoder and decoder (see newScript).
type codec interface{ lua() string }

// A mapFormat is how a map is stored: its entries, each of the entry
// format (a key field, then a value field), sorted and joined by a
// separator that neither field holds. Go reads and writes it through
// encode and decode; a script gets encode<Name>(t), which stores a Lua
// table of key -> value, and decode<Name>(s), which returns that table,
// besides the entry's own encode<Entry> and decode<Entry>. An entry not
// of the entry format is skipped, so a value of another layout reads as
// an empty map, or as the entries of it that are of the format.
type mapFormat struct {
	name  string
	sep   string // one punctuation character
	entry format // two fields: the key, then the value
}

// newMapFormat is a map of entries of the format entry joined by sep.
func newMapFormat(name, sep string, entry format) mapFormat {
	if len(entry.fields) != 2 || entry.optional || strings.Contains(entry.sep, sep) {
		panic(name + ": a map's entry is two fields, a key and a value, split by another separator")
	}
	return mapFormat{name: name, sep: sep, entry: entry}
}

// encode stores m: its entries, sorted.
func (f mapFormat) encode(m map[string]string) string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, f.entry.encode(k, v))
	}
	sort.Strings(out)
	return strings.Join(out, f.sep)
}

// decode reads a stored map: the entries of the entry format, the later
// one of a key kept.
func (f mapFormat) decode(s string) map[string]string {
	m := map[string]string{}
	for _, e := range strings.Split(s, f.sep) {
		if e == "" {
			continue
		}
		if kv, ok := f.entry.decode(e); ok {
			m[kv[0]] = kv[1]
		}
	}
	return m
}

// lua writes the entry's codec, then encode<Name> and decode<Name>.
// table.sort orders the encoded entries by their bytes, as sort.Strings
// does, so both write the same value.
func (f mapFormat) lua() string {
	var b strings.Builder
	b.WriteString(f.entry.lua())
	fmt.Fprintf(&b, "local function encode%s(t)\n", f.name)
	b.WriteString("  local out = {}\n")
	fmt.Fprintf(&b, "  for k, v in pairs(t) do out[#out + 1] = encode%s(k, v) end\n", f.entry.name)
	fmt.Fprintf(&b, "  table.sort(out)\n  return table.concat(out, '%s')\nend\n", f.sep)
	fmt.Fprintf(&b, "local function decode%s(s)\n", f.name)
	b.WriteString("  local out = {}\n")
	fmt.Fprintf(&b, "  for e in string.gmatch(s or '', '[^%%%s]+') do\n", f.sep)
	fmt.Fprintf(&b, "    local k, v = decode%s(e)\n", f.entry.name)
	b.WriteString("    if k then out[k] = v end\n  end\n  return out\nend\n")
	return b.String()
}

// An objectFormat is a stored JSON object that another package writes
// and the model adds fields to: the inbox entry is the push request's
// JSON, with the times of its keeping added. The format names the fields
// the model reads, the writer's and its own, each a string or an
// integer number. Go reads it through decode, and adds its fields through
// encode; a script gets decode<Name>(s), which returns every field in
// order, each nil when absent or of another kind (all nil when s is not
// a JSON object), and encode<Name>(obj, a1, ..., an), which appends the
// added fields to the object obj, an optional one only when given.
type objectFormat struct {
	name   string
	fields []objectField
}

// objectField is one field of an objectFormat.
type objectField struct {
	key  string // the JSON key
	text bool   // a JSON string; else an integer number
	// added: the model adds it to the writer's object (a number); with
	// optional, only when it has a value.
	added, optional bool
}

// newObjectFormat is an object format of fields: the writer's, then the
// added ones.
func newObjectFormat(name string, fields ...objectField) objectFormat {
	seenAdded := false
	for _, fl := range fields {
		switch {
		case fl.added && fl.text:
			panic(name + "." + fl.key + ": an added field is a number")
		case fl.optional && !fl.added:
			panic(name + "." + fl.key + ": only an added field is optional")
		case seenAdded && !fl.added:
			panic(name + "." + fl.key + ": the writer's fields come first")
		}
		seenAdded = seenAdded || fl.added
	}
	return objectFormat{name: name, fields: fields}
}

// added are the fields the model adds.
func (f objectFormat) added() []objectField {
	for i, fl := range f.fields {
		if fl.added {
			return f.fields[i:]
		}
	}
	return nil
}

// encode appends the added fields, in order, to obj, a JSON object with
// at least one field of its own; an optional field whose value is ""
// is left out. ok is false when obj is not such an object, or does not
// end with its closing brace: the script cuts obj's last byte and
// appends, and would write a value that is no JSON. (The script does not
// check: the gateway gives it a request it encoded itself.)
func (f objectFormat) encode(obj string, vals ...string) (string, bool) {
	added := f.added()
	if len(vals) != len(added) {
		panic(fmt.Sprintf("%s: %d added fields, want %d", f.name, len(vals), len(added)))
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal([]byte(obj), &fields) != nil || len(fields) == 0 || obj[len(obj)-1] != '}' {
		return "", false
	}
	var b strings.Builder
	b.WriteString(obj[:len(obj)-1])
	for i, fl := range added {
		if fl.optional && vals[i] == "" {
			continue
		}
		fmt.Fprintf(&b, ",%q:%s", fl.key, vals[i])
	}
	b.WriteString("}")
	return b.String(), true
}

// decode reads the fields of a stored object, in order: a string field
// as its text, a number as decimal digits, "" when absent or of another
// kind. A number that is not an integer (a fraction, or beyond 2^53
// written other than in digits) reads as absent, as in Lua. ok is false when s is not a JSON object.
func (f objectFormat) decode(s string) (vals []string, ok bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &obj) != nil || obj == nil {
		return nil, false
	}
	vals = make([]string, len(f.fields))
	for i, fl := range f.fields {
		raw, ok := obj[fl.key]
		if !ok {
			continue
		}
		if fl.text {
			var v string
			if json.Unmarshal(raw, &v) == nil && raw[0] == '"' {
				vals[i] = v
			}
			continue
		}
		var n json.Number
		if json.Unmarshal(raw, &n) != nil || raw[0] == '"' {
			continue
		}
		if v, err := n.Int64(); err == nil {
			vals[i] = strconv.FormatInt(v, 10)
		} else if x, err := n.Float64(); err == nil && x == math.Trunc(x) && math.Abs(x) <= 1<<53 {
			vals[i] = strconv.FormatInt(int64(x), 10) // 1e3, as Lua reads it
		}
	}
	return vals, true
}

// lua writes the format's encode<Name> and decode<Name>.
func (f objectFormat) lua() string {
	var b strings.Builder
	added := f.added()
	params := []string{"obj"}
	for i := range added {
		params = append(params, fmt.Sprintf("a%d", i+1))
	}
	fmt.Fprintf(&b, "local function encode%s(%s)\n", f.name, strings.Join(params, ", "))
	b.WriteString("  local s = string.sub(obj, 1, -2)\n")
	for i, fl := range added {
		p := params[i+1]
		add := fmt.Sprintf("s = s .. ',\"%s\":' .. %s", fl.key, p)
		if fl.optional {
			fmt.Fprintf(&b, "  if %s ~= nil and %s ~= '' then %s end\n", p, p, add)
		} else {
			fmt.Fprintf(&b, "  %s\n", add)
		}
	}
	b.WriteString("  return s .. '}'\nend\n")
	fmt.Fprintf(&b, "local function decode%s(s)\n", f.name)
	b.WriteString("  local ok, e = pcall(cjson.decode, s)\n")
	b.WriteString("  if not ok or type(e) ~= 'table' then return nil end\n")
	// A number is an integer, as Go reads it.
	b.WriteString("  local function field(k, kind)\n    local v = e[k]\n" +
		"    if type(v) ~= kind or (kind == 'number' and v ~= math.floor(v)) then return nil end\n" +
		"    return v\n  end\n")
	var ret []string
	for _, fl := range f.fields {
		kind := "number"
		if fl.text {
			kind = "string"
		}
		ret = append(ret, fmt.Sprintf("field('%s', '%s')", fl.key, kind))
	}
	fmt.Fprintf(&b, "  return %s\nend\n", strings.Join(ret, ", "))
	return b.String()
}
