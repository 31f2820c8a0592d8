package session

import (
	"fmt"
	"regexp"
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
		fmt.Fprintf(&b, "  local v = {string.match(s, '^%s$')}\n", with)
		b.WriteString("  if #v > 0 then return unpack(v) end\n")
		fmt.Fprintf(&b, "  v = {string.match(s, '^%s$')}\n", pat.String())
		b.WriteString("  if #v > 0 then v[#v + 1] = '' return unpack(v) end\n  return nil\nend\n")
	} else {
		fmt.Fprintf(&b, "  return string.match(s, '^%s$')\nend\n", pat.String())
	}
	return b.String()
}
