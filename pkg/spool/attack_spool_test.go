package spool

// Attacks on the spool's promise: a record Append acknowledged is read
// back, in order, until it is committed; nothing else is read back; a
// crash or damage loses no more than it must.
//
// The first three failed before reading went past damage (scan,
// skipDamage) and an unsavable read position was removed instead
// (saveCursor); the others passed from the start, each covering a risk.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// damage flips one byte of the payload of the i-th frame of the file in
// dir, in place, as a bad sector or a bit flip on the medium would: its
// checksum no longer matches. It returns the frame's offset.
func damage(t *testing.T, dir string, i int) int64 {
	t.Helper()
	path := filepath.Join(dir, dataFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	offsets, _ := Scan(data)
	if i >= len(offsets) {
		t.Fatalf("no frame %d among %d", i, len(offsets))
	}
	at := offsets[i] + headerSize
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{data[at] ^ 0x40}, at); err != nil {
		t.Fatal(err)
	}
	return offsets[i]
}

// TestAttackSpoolDamagedFrameLosesLaterRecords: one damaged record in the
// middle of the file (a flipped bit, a bad sector: whole, acknowledged
// frames follow it, so it is no torn append) makes Open cut off every
// record after it, not only the damaged one. The records after it were
// acknowledged by Append and their index entries settled by the listener
// (a spooled reminder's entry waits for a replay that now never comes, a
// spooled last stage's entry is gone): they are kept in a side file no
// program reads, and their guides are never sent.
//
// Failed when Open stopped at the first bad frame: of 99 undamaged
// records it kept 2. Now reading goes past the damaged frame to the next
// intact one, and only the damaged bytes are lost.
func TestAttackSpoolDamagedFrameLosesLaterRecords(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	recs := records("r", 100)
	for _, r := range recs { // one batch each, as the listener's sweeps append
		if err := s.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	damage(t, dir, 2)

	s = open(t, dir, 1<<20)
	got := drain(t, s, 1000)
	want := slices.Concat(recs[:2], recs[3:])
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("after one damaged record of %d: Open kept %d records and cut %d bytes aside (%s); want the %d undamaged ones: "+
			"every acknowledged record after the damage is lost to the replay", len(recs), len(got), s.Cut, s.CutFile, len(want))
	}
}

// TestAttackSpoolDamagedFrameBlocksEveryLaterRecord: a record damaged
// while the spool is open (a read error, a bit flip since it was
// written) stops Peek at it for good: the reader gets the same error
// however often it retries, and nothing appended after it can ever be
// read. The listener's replay retries forever, its spool never drains, so
// it spools every later timeout behind the damaged record (see the
// expiry package's TestAttackSpoolDamagedFrameBlackHolesLaterTimeouts).
//
// Failed when Peek answered "checksum mismatch" every time. Now Peek goes
// past the damaged frame to the next good one, counting the bytes it
// skipped (Skipped), and Commit moves past them.
func TestAttackSpoolDamagedFrameBlocksEveryLaterRecord(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	recs := records("r", 20)
	for _, r := range recs {
		if err := s.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	damage(t, dir, 0)
	later := records("later", 5)
	if err := s.Append(later...); err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	var lastErr error
	for try := 0; try < 10 && len(got) < len(recs)-1+len(later); try++ {
		rs, next, err := s.Peek(100)
		if err != nil {
			lastErr = err
			continue
		}
		got = append(got, rs...)
		if err := s.Commit(next); err != nil {
			t.Fatal(err)
		}
	}
	want := slices.Concat(recs[1:], later)
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("after one record damaged in place: read %d records in 10 tries (last error: %v), want the %d after it: "+
			"nothing appended after a damaged record is ever read", len(got), lastErr, len(want))
	}
}

// TestAttackSpoolUnsavableCursorFullWhileEmpty: when the read position
// cannot be saved (the directory takes no new file: inodes exhausted, or
// its permissions changed under the process; simulated here by a
// directory where the temporary file of the position goes), Commit fails
// after moving the position in memory, and the file is never truncated,
// since reset clears the saved position first. A spool drained to its
// last record then still counts every committed byte: Full() says true
// with nothing in it. The listener pauses every sweep while Full() (see
// the expiry package's TestAttackSpoolUnsavableCursorPausesListener), so
// with Kafka back and nothing to replay it takes no timeout ever again.
//
// Failed with Full() true at Len() 0. Now a position that cannot be
// written is removed (a restart reads from the start, repeating, never
// skipping), so the drained file is cut; and the listener pauses only
// while the spool has something to replay.
func TestAttackSpoolUnsavableCursorFullWhileEmpty(t *testing.T) {
	dir := t.TempDir()
	rec := bytes.Repeat([]byte("x"), 200)
	const max = 64 << 10
	s := open(t, dir, max)
	if err := os.Mkdir(filepath.Join(dir, cursorFile+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	for !s.Full() {
		if err := s.Append(rec); err != nil {
			t.Fatal(err)
		}
	}
	n := s.Len()
	var commitErr error
	for s.Len() > 0 { // as the replay does: a failed commit is logged, the replay goes on
		rs, next, err := s.Peek(50)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			t.Fatalf("Peek read nothing with Len %d", s.Len())
		}
		if err := s.Commit(next); err != nil {
			commitErr = err
		}
	}
	t.Logf("drained %d records; last commit error: %v", n, commitErr)
	if s.Full() {
		t.Fatalf("the spool is drained (Len 0) but Full() = true (Size %d of %d): the committed records are never cut "+
			"while the read position cannot be saved, and a listener pauses its sweeps for good", s.Size(), int64(max))
	}
}

// TestAttackSpoolTornAtEveryByte: a crash while a batch of several frames
// is being written leaves any prefix of it on disk. At every such prefix
// Open keeps every acknowledged record not yet committed, replays no
// committed one while the saved position survived, and reads no bytes of
// the torn batch but its whole frames (which the listener may replay: it
// left their timeouts in the index, unsent, so the sweep and the replay
// would produce the same event ids, which downstream collapses).
//
// PASSES: recovery is exact at every byte.
func TestAttackSpoolTornAtEveryByte(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	b1, b2, b3 := records("one", 3), records("two", 2), records("three", 4)
	for _, b := range [][][]byte{b1, b2} {
		if err := s.Append(b...); err != nil {
			t.Fatal(err)
		}
	}
	if _, next, err := s.Peek(len(b1)); err != nil {
		t.Fatal(err)
	} else if err := s.Commit(next); err != nil {
		t.Fatal(err)
	}
	s.Close()
	acked, err := os.ReadFile(filepath.Join(dir, dataFile))
	if err != nil {
		t.Fatal(err)
	}
	cursor, err := os.ReadFile(filepath.Join(dir, cursorFile))
	if err != nil {
		t.Fatal(err)
	}
	var torn []byte
	for _, r := range b3 {
		torn = AppendFrame(torn, r)
	}
	for cut := 0; cut <= len(torn); cut++ {
		for _, lostCursor := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d-lostCursor=%v", cut, lostCursor), func(t *testing.T) {
				d := t.TempDir()
				if err := os.WriteFile(filepath.Join(d, dataFile), slices.Concat(acked, torn[:cut]), 0o600); err != nil {
					t.Fatal(err)
				}
				if !lostCursor {
					if err := os.WriteFile(filepath.Join(d, cursorFile), cursor, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				s := open(t, d, 1<<20)
				got := drain(t, s, 100)
				want := slices.Clone(b2)
				if lostCursor {
					want = slices.Concat(b1, b2) // replayed, never skipped
				}
				whole, _ := Scan(torn[:cut])
				want = append(want, b3[:len(whole)]...)
				if !slices.EqualFunc(got, want, bytes.Equal) {
					t.Fatalf("torn at %d of %d bytes: read back %q, want %q", cut, len(torn), got, want)
				}
			})
		}
	}
}

// TestAttackSpoolConcurrentAppendAndDrain: the pipeline appends while the
// replay peeks and commits, and each commit that reaches the end cuts
// the file to nothing. An append racing that cut must be neither lost
// nor read twice, and the order must hold.
//
// PASSES: Append, Peek and Commit hold one lock; the cut happens under it.
func TestAttackSpoolConcurrentAppendAndDrain(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	const total = 3000
	done := make(chan struct{})
	var appendErr error
	go func() {
		defer close(done)
		for i := 0; i < total; {
			n := min(1+i%7, total-i)
			batch := make([][]byte, n)
			for j := range batch {
				batch[j] = []byte(strconv.Itoa(i + j))
			}
			if err := s.Append(batch...); err != nil {
				if errors.Is(err, ErrFull) {
					continue // the reader makes room
				}
				appendErr = err
				return
			}
			i += n
		}
	}()
	var got []int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for len(got) < total {
			rs, next, err := s.Peek(1 + len(got)%5)
			if err != nil {
				t.Error(err)
				return
			}
			for _, r := range rs {
				n, err := strconv.Atoi(string(r))
				if err != nil {
					t.Errorf("read back %q", r)
					return
				}
				got = append(got, n)
			}
			if err := s.Commit(next); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-done:
				if appendErr != nil {
					return
				}
			default:
			}
		}
	}()
	wg.Wait()
	<-done
	if appendErr != nil {
		t.Fatal(appendErr)
	}
	for i, n := range got {
		if n != i {
			t.Fatalf("record %d read back as %d (of %d read): lost, repeated or reordered", i, n, len(got))
		}
	}
	if len(got) != total || s.Len() != 0 || s.Size() != 0 {
		t.Fatalf("read %d of %d; Len %d, Size %d after draining", len(got), total, s.Len(), s.Size())
	}
}

// FuzzOpenRecovery: whatever a crash or damage left in the data file and
// the position file, Open succeeds without a panic; what it reads back
// are exactly the intact frames of the file as Scan finds them (none with
// a bad checksum), from the saved position when that is one of their
// boundaries, else from the first; the bytes after the last of them are
// kept aside; and the spool takes and reads back a record appended after
// recovery, across a reopen. (FuzzDamageBeforeFrames checks that Scan
// skips no intact frame.)
func FuzzOpenRecovery(f *testing.F) {
	two := AppendFrame(AppendFrame(nil, []byte("a")), []byte("bc"))
	f.Add([]byte{}, "")
	f.Add(two, "0")
	f.Add(two, "9")
	f.Add(two, strconv.Itoa(len(two)))
	f.Add(append(slices.Clone(two), 0, 0, 0, 1, 0xff), "9")
	f.Add(append(slices.Clone(two), make([]byte, 20)...), "junk")
	f.Add(AppendFrame(slices.Clone(two[:5]), []byte("x")), "-1")
	f.Fuzz(func(t *testing.T, data []byte, cursor string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, dataFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, cursorFile), []byte(cursor), 0o600); err != nil {
			t.Fatal(err)
		}
		offsets, valid := Scan(data)
		var frames [][]byte
		for _, off := range offsets {
			n := int64(data[off])<<24 | int64(data[off+1])<<16 | int64(data[off+2])<<8 | int64(data[off+3])
			frames = append(frames, data[off+headerSize:off+headerSize+n])
		}
		want := frames
		if pos, err := strconv.ParseInt(strings.TrimSpace(cursor), 10, 64); err == nil {
			if i := slices.Index(offsets, pos); i >= 0 {
				want = frames[i:]
			} else if pos == valid {
				want = nil
			}
		}
		s, err := Open(dir, 1<<30)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer s.Close()
		if s.Cut != int64(len(data))-valid {
			t.Fatalf("Cut = %d, want %d", s.Cut, int64(len(data))-valid)
		}
		if s.Cut > 0 {
			kept, err := os.ReadFile(s.CutFile)
			if err != nil || !bytes.Equal(kept, data[valid:]) {
				t.Fatalf("kept aside %d bytes (%v), want the %d after the intact frames", len(kept), err, len(data)-int(valid))
			}
		}
		if s.Len() != len(want) {
			t.Fatalf("Len = %d, want %d", s.Len(), len(want))
		}
		got := drain(t, s, 7)
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("read back %q, want %q", got, want)
		}
		if err := s.Append([]byte("after")); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s2, err := Open(dir, 1<<30)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer s2.Close()
		if got := drain(t, s2, 7); len(got) != 1 || string(got[0]) != "after" {
			t.Fatalf("after recovery, an appended record read back across a reopen as %q", got)
		}
	})
}
