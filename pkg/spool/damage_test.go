package spool

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// overwrite writes b over the data file of dir at off, in place.
func overwrite(t *testing.T, dir string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, dataFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// frameOffsets are the offsets of the frames in dir's data file.
func frameOffsets(t *testing.T, dir string) []int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, dataFile))
	if err != nil {
		t.Fatal(err)
	}
	offs, _ := Scan(data)
	return offs
}

// TestDamagedLastFrame: the last frame damaged while the spool is open
// has no intact frame after it: Peek goes past it to the end of the file,
// Commit there empties the spool, and the damaged bytes are counted and
// kept aside.
func TestDamagedLastFrame(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	recs := records("r", 4)
	if err := s.Append(recs...); err != nil {
		t.Fatal(err)
	}
	last := frameOffsets(t, dir)[3]
	overwrite(t, dir, last+headerSize, []byte{'X'})
	got, next, err := s.Peek(10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got, recs[:3], bytes.Equal) || next != s.Size() {
		t.Fatalf("read %q up to %d of %d; want the first three, up to the end", got, next, s.Size())
	}
	if err := s.Commit(next); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 0 || s.Size() != 0 {
		t.Fatalf("after the commit: Len %d, Size %d; want an empty spool", s.Len(), s.Size())
	}
	frame := int64(headerSize + len(recs[3]))
	kept, err := os.ReadFile(s.DamagedFile())
	if s.Skipped() != frame || err != nil || int64(len(kept)) != frame {
		t.Fatalf("Skipped %d, kept %d bytes (%v); want the damaged frame's %d", s.Skipped(), len(kept), err, frame)
	}
}

// TestDamageWiderThanAWindow: damage over more than skipDamage's window
// of the file (zeroed frames, a lost extent) is gone past to the intact
// frame after it, window after window.
func TestDamageWiderThanAWindow(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 16<<20)
	big := bytes.Repeat([]byte("x"), 900<<10)
	recs := [][]byte{[]byte("first"), big, big, big, []byte("last")}
	for _, r := range recs {
		if err := s.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	offs := frameOffsets(t, dir)
	overwrite(t, dir, offs[1], make([]byte, offs[4]-offs[1]))
	got := drain(t, s, 10)
	if want := [][]byte{recs[0], recs[4]}; !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("read back %d records, want first and last", len(got))
	}
	if s.Skipped() != offs[4]-offs[1] {
		t.Fatalf("Skipped %d, want %d", s.Skipped(), offs[4]-offs[1])
	}
}

// TestCursorAtDamagedFrame: a read position saved at a frame that was
// damaged since is this file's: a restart reads on from there (past the
// damage), not from the start.
func TestCursorAtDamagedFrame(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	recs := records("r", 6)
	if err := s.Append(recs...); err != nil {
		t.Fatal(err)
	}
	if _, next, err := s.Peek(2); err != nil {
		t.Fatal(err)
	} else if err := s.Commit(next); err != nil {
		t.Fatal(err)
	}
	s.Close()
	offs := frameOffsets(t, dir)
	overwrite(t, dir, offs[2]+headerSize, []byte{'X'})
	s = open(t, dir, 1<<20)
	if got := drain(t, s, 10); !slices.EqualFunc(got, recs[3:], bytes.Equal) {
		t.Fatalf("after a restart at the damaged frame: read back %q, want %q", got, recs[3:])
	}
}

// TestUnwritableCursorRemoved: a read position that cannot be written
// mid-file is removed, so that a restart reads everything again (the same
// records, which downstream collapses) instead of from an older one.
func TestUnwritableCursorRemoved(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	recs := records("r", 6)
	if err := s.Append(recs...); err != nil {
		t.Fatal(err)
	}
	// Saved once, at the first record.
	if _, next, err := s.Peek(1); err != nil {
		t.Fatal(err)
	} else if err := s.Commit(next); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, cursorFile+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, next, err := s.Peek(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(next); err == nil {
		t.Fatal("a commit whose position could not be saved said nothing")
	}
	if _, err := os.Stat(filepath.Join(dir, cursorFile)); !os.IsNotExist(err) {
		t.Fatalf("the older position is still there (%v): a restart would read from it", err)
	}
	if s.Len() != 2 {
		t.Fatalf("Len %d after committing 4 of 6, want 2", s.Len())
	}
	s.Close()
	if err := os.Remove(filepath.Join(dir, cursorFile+".tmp")); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, 1<<20)
	if got := drain(t, s, 10); !slices.EqualFunc(got, recs, bytes.Equal) {
		t.Fatalf("after a restart with the position removed: read back %q, want all %d again", got, len(recs))
	}
}

// FuzzDamageBeforeFrames: whatever damage comes before a run of intact
// frames (bytes with no zero among them, as the JSON records have none:
// no false frame can start there), Open and Peek read every frame of the
// run, in order, and count the damage as skipped.
func FuzzDamageBeforeFrames(f *testing.F) {
	f.Add([]byte("garbage"), 3, true)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5}, 1, false)
	f.Add([]byte("{\"uid\":\"u\"}"), 5, true)
	f.Fuzz(func(t *testing.T, junk []byte, n int, reopen bool) {
		junk = bytes.ReplaceAll(junk, []byte{0}, []byte{1})
		n = 1 + abs(n)%20
		head := []byte("head")
		recs := make([][]byte, n)
		for i := range recs {
			recs[i] = []byte("rec-" + strconv.Itoa(i))
		}
		// Written as appends would write them (without their syncs, for
		// speed): head, a frame the junk overwrites in place, as damage
		// would, then the run.
		data := AppendFrame(nil, head)
		from := int64(len(data))
		data = AppendFrame(data, bytes.Repeat([]byte("z"), max(len(junk), 1)))
		to := int64(len(data))
		for _, r := range recs {
			data = AppendFrame(data, r)
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, dataFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		var s *Spool
		if reopen { // found by Open's recovery
			overwrite(t, dir, from, junk)
			s = open(t, dir, 1<<20)
		} else { // found by Peek, damaged since Open
			s = open(t, dir, 1<<20)
			overwrite(t, dir, from, junk)
		}
		got := drain(t, s, 3)
		if len(junk) == 0 {
			return
		}
		if want := slices.Concat([][]byte{head}, recs); !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("read back %q, want %q", got, want)
		}
		if s.Skipped() != to-from {
			t.Fatalf("Skipped %d, want %d", s.Skipped(), to-from)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
