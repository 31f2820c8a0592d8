package spool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func open(t *testing.T, dir string, max int64) *Spool {
	t.Helper()
	s, err := Open(dir, max)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func records(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%03d", prefix, i)
	}
	return out
}

// drain peeks and commits everything, in chunks of chunk.
func drain(t *testing.T, s *Spool, chunk int) [][]byte {
	t.Helper()
	var got [][]byte
	for {
		recs, next, err := s.Peek(chunk)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return got
		}
		got = append(got, recs...)
		if err := s.Commit(next); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAppendPeekCommit(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	a, b := records("a", 10), records("b", 5)
	if err := s.Append(a...); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(b...); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 15 {
		t.Fatalf("Len = %d, want 15", s.Len())
	}
	got := drain(t, s, 4)
	if want := append(slices.Clone(a), b...); !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("read back %q, want %q", got, want)
	}
	if s.Len() != 0 || s.Size() != 0 {
		t.Fatalf("after draining: Len %d, Size %d, want 0, 0", s.Len(), s.Size())
	}
	fi, err := os.Stat(filepath.Join(dir, dataFile))
	if err != nil || fi.Size() != 0 {
		t.Fatalf("file after draining: %v, %v; want empty", fi, err)
	}
}

// TestReopen: what was appended and not committed is there after a
// restart, from where the last run stopped reading.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	if err := s.Append(records("r", 10)...); err != nil {
		t.Fatal(err)
	}
	recs, next, err := s.Peek(3)
	if err != nil || len(recs) != 3 {
		t.Fatal(recs, err)
	}
	if err := s.Commit(next); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open(t, dir, 1<<20)
	if s.Len() != 7 {
		t.Fatalf("Len after reopen = %d, want 7", s.Len())
	}
	got := drain(t, s, 100)
	if want := records("r", 10)[3:]; !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("read back %q, want %q", got, want)
	}
}

// TestTornTail: a crash in the middle of an append leaves part of a
// frame; Open cuts it off and keeps every whole frame before it.
func TestTornTail(t *testing.T) {
	for cut := 1; cut < headerSize+5; cut++ {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 1<<20)
			if err := s.Append(records("r", 3)...); err != nil {
				t.Fatal(err)
			}
			s.Close()
			torn := AppendFrame(nil, []byte("torn!"))[:cut]
			f, err := os.OpenFile(filepath.Join(dir, dataFile), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write(torn)
			f.Close()

			s = open(t, dir, 1<<20)
			if s.Cut != int64(cut) {
				t.Errorf("Cut = %d, want %d", s.Cut, cut)
			}
			if kept, err := os.ReadFile(s.CutFile); err != nil || !bytes.Equal(kept, torn) {
				t.Errorf("kept tail %q, %v; want %q", kept, err, torn)
			}
			if err := s.Append([]byte("after")); err != nil {
				t.Fatal(err)
			}
			got := drain(t, s, 100)
			want := append(records("r", 3), []byte("after"))
			if !slices.EqualFunc(got, want, bytes.Equal) {
				t.Fatalf("read back %q, want %q", got, want)
			}
		})
	}
}

// TestStaleCursor: a read position that is not a frame boundary, or past
// the end, means reading from the start: repeated, never skipped.
func TestStaleCursor(t *testing.T) {
	for _, pos := range []string{"5", "99999", "junk", "-3"} {
		t.Run(pos, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 1<<20)
			if err := s.Append(records("r", 4)...); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if err := os.WriteFile(filepath.Join(dir, cursorFile), []byte(pos), 0o600); err != nil {
				t.Fatal(err)
			}
			s = open(t, dir, 1<<20)
			if got := drain(t, s, 100); !slices.EqualFunc(got, records("r", 4), bytes.Equal) {
				t.Fatalf("read back %q, want all four", got)
			}
		})
	}
}

// TestZeroTail: zeros at the end of the file, as a crash can leave, are
// not records.
func TestZeroTail(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	if err := s.Append(records("r", 3)...); err != nil {
		t.Fatal(err)
	}
	s.Close()
	f, err := os.OpenFile(filepath.Join(dir, dataFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 64))
	f.Close()
	s = open(t, dir, 1<<20)
	if s.Len() != 3 || s.Cut != 64 {
		t.Fatalf("after a zeroed tail: Len %d, Cut %d; want 3, 64", s.Len(), s.Cut)
	}
	if err := s.Append(nil); err == nil {
		t.Error("an empty record was taken")
	}
}

// TestCursorOfAnEmptiedFile: a read position left from a spool that was
// emptied (the crash came between clearing it and cutting the file) must
// not skip records appended since, even where it falls on their frame
// boundaries.
func TestCursorOfAnEmptiedFile(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	if err := s.Append(records("old", 6)...); err != nil {
		t.Fatal(err)
	}
	_, next, err := s.Peek(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(next); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The file cut, the position of the old contents still saved.
	if err := os.Truncate(filepath.Join(dir, dataFile), 0); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, 1<<20)
	if err := s.Append(records("new", 6)...); err != nil { // same sizes: same boundaries
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir, 1<<20)
	if got := drain(t, s, 100); !slices.EqualFunc(got, records("new", 6), bytes.Equal) {
		t.Fatalf("read back %q, want all six new records", got)
	}
}

func TestFull(t *testing.T) {
	rec := bytes.Repeat([]byte("x"), 100)
	frame := int64(headerSize + len(rec))
	s := open(t, t.TempDir(), 3*frame)
	if err := s.Append(rec, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(rec, rec); !errors.Is(err, ErrFull) {
		t.Fatalf("append past the cap: %v, want ErrFull", err)
	}
	if s.Len() != 2 || s.Size() != 2*frame {
		t.Fatalf("after a refused append: Len %d, Size %d; want 2, %d", s.Len(), s.Size(), 2*frame)
	}
	if s.Full() {
		t.Fatal("Full() = true with a third of the cap free")
	}
	if err := s.Append(rec); err != nil {
		t.Fatalf("append up to the cap: %v", err)
	}
	if !s.Full() {
		t.Fatal("Full() = false at the cap")
	}
	drain(t, s, 10)
	if s.Full() {
		t.Fatal("Full() = true once drained")
	}
}

func TestLockedAgainstASecondOpen(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, 1<<20)
	if s, err := Open(dir, 1<<20); err == nil {
		s.Close()
		t.Fatal("a second Open of the same directory succeeded")
	}
}

func TestBadInput(t *testing.T) {
	s := open(t, t.TempDir(), 1<<30)
	if err := s.Append(make([]byte, MaxRecord+1)); err == nil {
		t.Error("an oversized record was taken")
	}
	if err := s.Append([]byte("a"), []byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(3); err == nil {
		t.Error("Commit off a frame boundary succeeded")
	}
	if err := s.Commit(1 << 20); err == nil {
		t.Error("Commit past the end succeeded")
	}
	if s.Len() != 2 {
		t.Errorf("Len after bad commits = %d, want 2", s.Len())
	}
	if _, err := Open(t.TempDir(), 4); err == nil {
		t.Error("a 4-byte cap was accepted")
	}
}

// FuzzScan: Scan never panics, and the frames it accepts are exactly the
// leading whole frames, so appending a good frame after them reads back.
func FuzzScan(f *testing.F) {
	f.Add([]byte{})
	f.Add(AppendFrame(nil, []byte("hello")))
	f.Add(AppendFrame(AppendFrame(nil, []byte("a")), []byte("bc"))[:12])
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		offsets, valid := Scan(data)
		if valid < 0 || valid > int64(len(data)) {
			t.Fatalf("valid = %d of %d bytes", valid, len(data))
		}
		for i, off := range offsets {
			if i > 0 && off <= offsets[i-1] {
				t.Fatalf("offsets not increasing: %v", offsets)
			}
		}
		again := AppendFrame(slices.Clone(data[:valid]), []byte("tail"))
		offs2, valid2 := Scan(again)
		if len(offs2) != len(offsets)+1 || valid2 != int64(len(again)) {
			t.Fatalf("a good frame after the valid prefix: %d frames, %d of %d bytes", len(offs2), valid2, len(again))
		}
	})
}
