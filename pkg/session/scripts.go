package session

import (
	"context"
	"embed"
	"fmt"
	"reflect"
	"strings"
	"unicode"

	"github.com/redis/go-redis/v9"
)

// Every Lua script of the model is a file of lua/, embedded here, and
// nowhere else. A script is loaded with what it shares with the others,
// in this order:
//
//  1. the clock prelude (lua/clock.lua): redisNowMS(), Redis's clock in
//     ms, which every deadline and mark is written from;
//  2. K, its keys by name: a Go type declares each script's KEYS (a
//     struct of key fields, a []string last for a variable tail, see
//     keyTable), and the table is written from that type, so the script
//     says KEYS[K.index] and no order is shared with another file;
//  3. V, its vocabulary by name, when it has any (blind reasons, claim
//     states): the values are the Go constants, written into the source
//     as literals, never retyped in Lua (see vocabulary);
//  4. the encoders and decoders of the stored values it reads or
//     writes, written from their field lists (see values.go);
//  5. any library it names (lua/roles.lua);
//  6. the script's own file.
//
// scriptkeys_test.go reads every loaded script and checks that each key
// it touches is one of KEYS.

//go:embed lua/*.lua
var luaFiles embed.FS

// loaded are the sources of every script, by file, for the key check.
var loaded = map[string]string{}

// loadedLibs are the lua/ files loaded as a part of other scripts
// (clock.lua is every script's), by name.
var loadedLibs = map[string]bool{"clock": true}

// keyList is a script's keys: list returns them in the order of the
// type's fields, which keyTable writes into the script.
type keyList interface{ list() []string }

// script is a Lua script whose KEYS are a K.
type script[K keyList] struct {
	*redis.Script
}

// newScript loads lua/<file>.lua with the prelude, K's key table, the
// vocabulary v (a struct of string fields, or nil), the codecs of the
// stored values it reads or writes, and the libraries libs (files of
// lua/).
func newScript[K keyList](file string, v any, codecs []codec, libs ...string) script[K] {
	var b strings.Builder
	b.WriteString(luaFile("clock"))
	b.WriteString(keyTable(reflect.TypeFor[K]()))
	vocabulary(&b, v)
	for _, c := range codecs {
		b.WriteString(c.lua())
	}
	for _, l := range libs {
		b.WriteString(luaFile(l))
		loadedLibs[l] = true
	}
	b.WriteString(luaFile(file))
	src := b.String()
	if _, dup := loaded[file]; dup {
		panic("script " + file + " loaded twice")
	}
	loaded[file] = src
	return script[K]{Script: redis.NewScript(src)}
}

func luaFile(name string) string {
	src, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return string(src)
}

// Run runs the script by its hash, or its source if Redis has not cached it.
func (s script[K]) Run(ctx context.Context, c redis.Scripter, keys K, args ...any) *redis.Cmd {
	return s.Script.Run(ctx, c, keys.list(), args...)
}

// Eval queues the script with its source, as in a pipeline.
func (s script[K]) Eval(ctx context.Context, c redis.Scripter, keys K, args ...any) *redis.Cmd {
	return s.Script.Eval(ctx, c, keys.list(), args...)
}

// call is one call of the script, as runScripts takes it.
func (s script[K]) call(keys K, args ...any) (*redis.Script, []string, []any) {
	return s.Script, keys.list(), args
}

// keyTable writes the Lua table K of a key type: each string field's
// index in KEYS, by the field's name with a lower-case first letter, and
// for a last []string field the index its keys start at. An embedded
// struct's fields count as the type's own.
func keyTable(t reflect.Type) string {
	names, tail := keyNames(t)
	var b strings.Builder
	b.WriteString("local K = {")
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s = %d", n, i+1)
	}
	if tail != "" {
		if len(names) > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s = %d", tail, len(names)+1)
	}
	b.WriteString("}\n")
	return b.String()
}

// keyNames returns the Lua names of a key type's string fields, in
// order, and of its tail, if it has one.
func keyNames(t reflect.Type) (names []string, tail string) {
	for i := range t.NumField() {
		f := t.Field(i)
		switch {
		case f.Anonymous && f.Type.Kind() == reflect.Struct:
			sub, subTail := keyNames(f.Type)
			if subTail != "" {
				panic(t.String() + ": an embedded key type with a tail")
			}
			names = append(names, sub...)
		case f.Type.Kind() == reflect.String:
			names = append(names, luaName(f.Name))
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.String && i == t.NumField()-1:
			tail = luaName(f.Name)
		default:
			panic(t.String() + "." + f.Name + ": a key field is a string, or a []string last")
		}
	}
	return names, tail
}

func luaName(goName string) string {
	r := []rune(goName)
	r[0] = unicode.ToLower(r[0])
	return string(r)
}

// vocabulary writes the Lua table V of a vocabulary struct's string
// fields, each the field's value as a Lua string literal. They were once
// passed as the last ARGV of every call: 11 of a renewal's 20 arguments,
// which the gateway built and Redis read on every ping.
func vocabulary(b *strings.Builder, v any) {
	if v == nil {
		return
	}
	rv := reflect.ValueOf(v)
	t := rv.Type()
	b.WriteString("local V = {")
	for i := range t.NumField() {
		if t.Field(i).Type.Kind() != reflect.String {
			panic(t.String() + "." + t.Field(i).Name + ": vocabulary is strings")
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(b, "%s = %s", luaName(t.Field(i).Name), luaString(rv.Field(i).String()))
	}
	b.WriteString("}\n")
}

// ScriptNames maps the SHA1 of every loaded script (what EVALSHA names it
// by, in SLOWLOG or MONITOR) to its file's name in lua/, for tools that
// tell Redis's time apart by script.
func ScriptNames() map[string]string {
	out := make(map[string]string, len(loaded))
	for file, src := range loaded {
		out[redis.NewScript(src).Hash()] = file
	}
	return out
}
