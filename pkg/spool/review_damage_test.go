package spool

// Review of reading past damage (scan, nextFrame, skipDamage), of Commit
// past damage and of the read position removed when it cannot be saved.
//
// The first four failed on the change as reviewed (each says how, and
// what fixed it; one part of the third is a known limit and skips); the
// last two passed from the start, each proving a property it relies on.
//
// Run: go test -race -count=1 -run 'TestReview' ./pkg/spool/

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// blockPosition makes the read position of dir neither writable nor
// removable: a directory with a file in it where the position goes (as a
// directory whose permissions changed under the process would be: the
// open data file can still be written, no name in the directory changed).
func blockPosition(t *testing.T, dir string) {
	t.Helper()
	os.Remove(filepath.Join(dir, cursorFile))
	if err := os.MkdirAll(filepath.Join(dir, cursorFile, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
}

// TestReviewDamagedFrameKeepsLenWhenResetFails: a frame appended in this
// run and damaged since stays counted in pending (Append counted it,
// Commit subtracts only the intact frames it passes), "until reset". When
// reset fails (the position neither writable nor removable, which the
// change handles by leaving the file whole; or a Truncate or Sync error,
// likely on the very disk that damaged the frame) the count is never
// taken back: Len() stays above 0 with nothing left to read.
//
// In the listener this undoes the fix for a full spool that cannot be
// cut: pausedBySpool is Full() && Len() > 0, so it pauses every sweep for
// good; direct() is false for good, so every new timeout goes to the
// spool; and the replay loop, seeing Len() > 0, peeks nothing, commits
// nothing and goes round again without waiting, a busy loop on the
// spool's lock (see the expiry package's
// TestReviewSpoolDamageWithUnsavablePositionPausesListener).
//
// Failed so: Len() was 1 after every record was read and committed, and
// Peek returned nothing. Now nothing is pending once Commit reaches the
// end of the file, whatever reset does.
func TestReviewDamagedFrameKeepsLenWhenResetFails(t *testing.T) {
	dir := t.TempDir()
	const max = 8 << 10
	s := open(t, dir, max)
	rec := bytes.Repeat([]byte("x"), 200)
	for !s.Full() {
		if err := s.Append(rec); err != nil {
			t.Fatal(err)
		}
	}
	n := s.Len()
	offs := frameOffsets(t, dir)
	overwrite(t, dir, offs[n/2]+headerSize, []byte{'!'}) // one frame damaged in place
	blockPosition(t, dir)

	read := 0
	var commitErr error
	for try := 0; try < 10; try++ { // as the replay does: a failed commit is logged, it goes on
		rs, next, err := s.Peek(50)
		if err != nil {
			t.Fatal(err)
		}
		read += len(rs)
		if err := s.Commit(next); err != nil {
			commitErr = err
		}
		if next == s.Size() {
			break
		}
	}
	rs, next, err := s.Peek(50)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read %d of %d records (one damaged); last commit error: %v", read, n, commitErr)
	if read != n-1 || len(rs) != 0 {
		t.Fatalf("read %d records then %d more, want %d then none", read, len(rs), n-1)
	}
	if s.Len() != 0 {
		t.Fatalf("every intact record read and committed, Peek returns nothing (next %d, Size %d), "+
			"but Len() = %d and Full() = %v: the damaged frame stays counted because reset failed; "+
			"a listener pauses for good (Full && Len > 0) and spins in its replay loop",
			next, s.Size(), s.Len(), s.Full())
	}
}

// TestReviewCommitRefusedAfterTrailingDamageAndAppend: Peek goes past
// damage at the end of the file to the end (no intact frame after it)
// and returns that end as next; Commit accepts a next with no frame
// boundary at it only while it is still the end (next == s.size). In the
// listener an Append between the replay's Peek and its Commit is the
// normal case (while the spool holds anything, every new timeout is
// spooled): Commit then refuses Peek's own next as "not on a frame
// boundary", the replay logs it and peeks again from the same head,
// producing the whole chunk a second time and going past the same damage
// a second time, counting it twice and keeping it twice.
//
// Failed so: Commit returned "commit to N is not on a frame boundary";
// the chunk was read again and Skipped doubled. Now Commit takes the last
// Peek's own next (and the records it read) as it is.
func TestReviewCommitRefusedAfterTrailingDamageAndAppend(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	recs := records("r", 5)
	if err := s.Append(recs...); err != nil {
		t.Fatal(err)
	}
	offs := frameOffsets(t, dir)
	overwrite(t, dir, offs[4]+headerSize, []byte{'!'}) // the last frame damaged in place
	got, next, err := s.Peek(100)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got, recs[:4], bytes.Equal) || next != s.Size() {
		t.Fatalf("Peek read %q up to %d of %d, want the first four up to the end", got, next, s.Size())
	}
	skipped := s.Skipped()
	// A timeout spooled while the chunk is being produced.
	later := []byte("later")
	if err := s.Append(later); err != nil {
		t.Fatal(err)
	}
	commitErr := s.Commit(next)
	again, _, err := s.Peek(100)
	if err != nil {
		t.Fatal(err)
	}
	if commitErr != nil || !slices.EqualFunc(again, [][]byte{later}, bytes.Equal) || s.Skipped() != skipped {
		t.Fatalf("Commit of Peek's own next after an append: %v; the next Peek reads %d records (want only the "+
			"appended one), Skipped %d then %d: the chunk is produced again and the damage counted and kept twice",
			commitErr, len(again), skipped, s.Skipped())
	}
}

// TestReviewResyncCostOfDamage: nextFrame tries every offset whose first
// byte is zero and whose next three make a length up to MaxRecord, and
// checksums that many bytes at each: the cost of going past damage is
// its size times up to MaxRecord, not its size. Damage holding small
// big- or little-endian integers (a misdirected write of another file's
// blocks, a metadata block) is full of such offsets.
//
// Measured (no race detector, two cores): 8 MiB of 00 10 00 00 repeated
// took Open 82 s; 8 MiB of little-endian 32-bit counters 6 s; 8 MiB of
// zeros 0.15 s; random bytes cost about a checksum of a few hundred KiB
// per KiB of damage.
//
// Open's cost is a known limit, not fixed (its subtest skips): rejecting
// a false candidate in O(1) needs a checksum of each frame's header, a
// change of the file's format (with a version mark for old files). The
// reader's cost no longer holds up the writers: Peek searched with the
// spool's lock held, and an Append (every batch of the listener, whose
// direct() reads Len()) waited behind it, about 15 s for 2 MiB; now the
// search runs with the lock let go.
func TestReviewResyncCostOfDamage(t *testing.T) {
	t.Run("Open", func(t *testing.T) {
		t.Skip("known limit, not fixed: going past damage costs its size times up to MaxRecord; an O(1) rejection needs a header checksum, a format change")
	})

	t.Run("Peek lets appends through", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, 1<<20)
		recs := records("r", 4)
		if err := s.Append(recs...); err != nil {
			t.Fatal(err)
		}
		offs := frameOffsets(t, dir)
		overwrite(t, dir, offs[1]+headerSize, []byte{'!'}) // damage after Open: Peek finds it
		// The search is held (as a long one would take its time) until
		// an Append has gone through.
		searching, release := make(chan struct{}), make(chan struct{})
		s.testSearching = func() {
			close(searching)
			<-release
		}
		done := make(chan [][]byte, 1)
		go func() {
			rs, _, err := s.Peek(10)
			if err != nil {
				t.Error(err)
			}
			done <- rs
		}()
		<-searching
		appended := make(chan error, 1)
		go func() { appended <- s.Append([]byte("meanwhile")) }()
		select {
		case err := <-appended:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(patience):
			close(release)
			t.Fatalf("an Append waited %v for a Peek going past damage to finish its search", patience)
		}
		close(release)
		want := [][]byte{recs[0], recs[2], recs[3], []byte("meanwhile")}
		if rs := <-done; !slices.EqualFunc(rs, want, bytes.Equal) {
			t.Fatalf("Peek past the damage read %q, want %q", rs, want)
		}
	})
}

// patience bounds a wait for what must happen at once.
const patience = 15 * time.Second

// TestReviewOpenFailsWhenPositionIsOnlyRemovable: the change makes a read
// position that cannot be written be removed instead, "and the spool goes
// on" (Commit, the replay). Open does not go on: recover returns reset's
// or saveCursor's error, which wraps errPositionRemoved after the file
// was cut or the position removed as intended, and Open closes the spool
// and fails. The listener then fails to start (the directory takes no
// new file: a full disk, exhausted inodes) though Kafka may well be up
// and nothing waits in the spool. The next start succeeds (the position
// is gone by then), so it costs one failed start, not a loss.
//
// Failed so: Open returned "... removed it instead: a restart reads the
// spool from its start". Now Open goes on, saying so in PositionLost,
// which the listener logs.
func TestReviewOpenFailsWhenPositionIsOnlyRemovable(t *testing.T) {
	for _, tc := range []struct {
		name string
		pos  func(size int64) int64
	}{
		{"all committed, not cut", func(size int64) int64 { return size }}, // reset at Open
		{"stale position", func(size int64) int64 { return 3 }},            // replaced at Open
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var data []byte
			for _, r := range records("r", 4) {
				data = AppendFrame(data, r)
			}
			if err := os.WriteFile(filepath.Join(dir, dataFile), data, 0o600); err != nil {
				t.Fatal(err)
			}
			pos := fmt.Append(nil, tc.pos(int64(len(data))))
			if err := os.WriteFile(filepath.Join(dir, cursorFile), pos, 0o600); err != nil {
				t.Fatal(err)
			}
			// The position can be removed but not written.
			if err := os.Mkdir(filepath.Join(dir, cursorFile+".tmp"), 0o700); err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir, 1<<20)
			if err != nil {
				if !errors.Is(err, errPositionRemoved) {
					t.Fatalf("Open: %v (not the removed-position case this test is about)", err)
				}
				t.Fatalf("Open failed though its position was removed as intended (a restart reads from the start): %v", err)
			}
			s.Close()
		})
	}
}

// TestReviewHeaderDamageCostsOnlyItsFrame: every value of every byte of
// one frame's header (its length and its checksum), and lengths that make
// it span exactly the next one, two or three frames, or their headers, cost
// that frame only: Scan (Open) and Peek read every other frame, in order,
// and no frame that was never written. A damaged length that makes the
// frame longer would need the checksum of the longer payload, which
// includes the next frame's header, to equal the stored one: a CRC-32C
// collision, one chance in 2^32 per damage, never met here; shorter, it
// resumes inside its own payload, where JSON puts no zero byte for a
// false frame to start at.
//
// PASSES: no intact frame is lost and no phantom frame is read.
func TestReviewHeaderDamageCostsOnlyItsFrame(t *testing.T) {
	payloads := [][]byte{
		[]byte(`{"v":1,"id":"a","uid":"user-0001"}`),
		bytes.Repeat([]byte(`{"k":"v"}`), 40),
		[]byte(`{"v":1,"id":"c","uid":"user-0003","text":"are you still there?"}`),
		bytes.Repeat([]byte(`{"k":"w"}`), 30),
		[]byte(`{"v":1,"id":"e"}`),
		bytes.Repeat([]byte(`"z"`), 300),
	}
	var data []byte
	var offs []int64
	for _, p := range payloads {
		offs = append(offs, int64(len(data)))
		data = AppendFrame(data, p)
	}
	const hit = 2
	want := slices.Delete(slices.Clone(payloads), hit, hit+1)
	wantOffs := slices.Delete(slices.Clone(offs), hit, hit+1)

	type damage struct {
		at int
		b  []byte
	}
	var cases []damage
	for i := range headerSize {
		for v := range 256 {
			if byte(v) != data[offs[hit]+int64(i)] {
				cases = append(cases, damage{i, []byte{byte(v)}})
			}
		}
	}
	n := int64(len(payloads[hit]))
	for _, end := range []int64{offs[hit+1], offs[hit+2], offs[hit+3]} {
		for _, d := range []int64{-8, -4, -1, 0, 1, 4, 8} {
			l := end - offs[hit] - headerSize + d
			if l > 0 && l != n {
				cases = append(cases, damage{0, binary.BigEndian.AppendUint32(nil, uint32(l))})
			}
		}
	}

	dir := t.TempDir()
	s := open(t, dir, 1<<20)
	if err := s.Append(payloads...); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		d := slices.Clone(data)
		copy(d[offs[hit]+int64(c.at):], c.b)
		if got, _ := Scan(d); !slices.Equal(got, wantOffs) {
			t.Fatalf("header byte %d set to % x: Scan finds frames at %v, want %v", c.at, c.b, got, wantOffs)
		}
		overwrite(t, dir, offs[hit]+int64(c.at), c.b)
		got, next, err := s.Peek(100)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, want, bytes.Equal) || next != int64(len(data)) {
			t.Fatalf("header byte %d set to % x: Peek reads %d records up to %d, want %d up to %d",
				c.at, c.b, len(got), next, len(want), len(data))
		}
		overwrite(t, dir, offs[hit], data[offs[hit]:offs[hit]+headerSize]) // restore
	}
	t.Logf("%d header damages: each cost its frame only", len(cases))
}

// TestReviewPositionAcrossDamageNeverSkips: a read position saved at a
// frame boundary, then damage of frames around it, then a restart. The
// position is trusted only where the scan from the start of the file
// reaches it (an intact frame, the start of a damaged span, the end);
// elsewhere reading starts again from the start. Whatever frames are
// damaged, every intact frame at or after the position is read back
// (records before it may be repeated, which downstream collapses), and
// none after it is skipped; also across a position removed because it
// could not be written, then appends, then a restart; and a position
// removed, then saved again by a later commit, is this file's: the
// restart resumes exactly there.
//
// PASSES.
func TestReviewPositionAcrossDamageNeverSkips(t *testing.T) {
	recs := records("r", 8)
	const head = 4 // the position is saved at frame 4
	for _, hit := range [][]int{{3}, {4}, {5}, {3, 4}, {2, 3}, {4, 5}, {3, 4, 5}, {0, 1, 2, 3}, {7}, {4, 5, 6, 7}} {
		t.Run(fmt.Sprint(hit), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 1<<20)
			if err := s.Append(recs...); err != nil {
				t.Fatal(err)
			}
			if _, next, err := s.Peek(head); err != nil {
				t.Fatal(err)
			} else if err := s.Commit(next); err != nil {
				t.Fatal(err)
			}
			s.Close()
			offs := frameOffsets(t, dir)
			for _, i := range hit {
				overwrite(t, dir, offs[i]+headerSize+1, []byte{'!'})
			}
			s = open(t, dir, 1<<20)
			got := drain(t, s, 3)
			for i := head; i < len(recs); i++ {
				if !slices.Contains(hit, i) && !slices.ContainsFunc(got, func(r []byte) bool { return bytes.Equal(r, recs[i]) }) {
					t.Fatalf("damaged %v, position at %d: read back %q, record %d (intact, uncommitted) is missing", hit, head, got, i)
				}
			}
		})
	}

	t.Run("removed position, saved again, restart", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, 1<<20)
		if err := s.Append(recs...); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, cursorFile+".tmp"), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, next, err := s.Peek(2); err != nil {
			t.Fatal(err)
		} else if err := s.Commit(next); !errors.Is(err, errPositionRemoved) {
			t.Fatalf("commit with an unwritable position: %v, want it removed", err)
		}
		if err := os.Remove(filepath.Join(dir, cursorFile+".tmp")); err != nil {
			t.Fatal(err)
		}
		if _, next, err := s.Peek(3); err != nil {
			t.Fatal(err)
		} else if err := s.Commit(next); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s = open(t, dir, 1<<20)
		if got := drain(t, s, 3); !slices.EqualFunc(got, recs[5:], bytes.Equal) {
			t.Fatalf("read back %q after the position was saved again, want %q", got, recs[5:])
		}
	})

	t.Run("removed position, appends, restart", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, 1<<20)
		if err := s.Append(recs[:4]...); err != nil {
			t.Fatal(err)
		}
		if _, next, err := s.Peek(2); err != nil {
			t.Fatal(err)
		} else if err := s.Commit(next); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, cursorFile+".tmp"), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, next, err := s.Peek(1); err != nil {
			t.Fatal(err)
		} else if err := s.Commit(next); !errors.Is(err, errPositionRemoved) {
			t.Fatalf("commit with an unwritable position: %v, want it removed", err)
		}
		if err := s.Append(recs[4:]...); err != nil {
			t.Fatal(err)
		}
		offs := frameOffsets(t, dir)
		overwrite(t, dir, offs[2]+headerSize+1, []byte{'!'}) // the committed frame after the last saved position
		s.Close()                                            // a crash: nothing more committed
		if err := os.Remove(filepath.Join(dir, cursorFile+".tmp")); err != nil {
			t.Fatal(err)
		}
		s = open(t, dir, 1<<20)
		got := drain(t, s, 3)
		if want := slices.Delete(slices.Clone(recs), 2, 3); !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("read back %q, want %q (all but the damaged one, from the start)", got, want)
		}
	})
}
