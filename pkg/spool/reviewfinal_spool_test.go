package spool

import (
	"fmt"
	"testing"
)

// TestReviewFinalStaleCommitAfterResetSkipsNewRecords: two readers (the
// Spool's methods may be called from several goroutines) Peek the same
// records, as rmu allows: it serializes each call, not a Peek with its
// Commit. The second commits them all, which empties and cuts the file;
// records of the same sizes are appended and acknowledged. The first
// reader's Commit of its (older) next then falls on a frame boundary of
// the new file: it must be refused or leave the new records pending,
// never commit records nobody read. Failed so: it committed them. Now
// Commit takes only the last Peek's next.
func TestReviewFinalStaleCommitAfterResetSkipsNewRecords(t *testing.T) {
	s, err := Open(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := func(i int) []byte { return []byte(fmt.Sprintf(`{"n":%03d}`, i)) }
	if err := s.Append(rec(1), rec(2)); err != nil {
		t.Fatal(err)
	}
	_, nextA, err := s.Peek(10)
	if err != nil {
		t.Fatal(err)
	}
	_, nextB, err := s.Peek(10)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(nextB); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(rec(3), rec(4)); err != nil {
		t.Fatal(err)
	}
	cerr := s.Commit(nextA)
	got, _, err := s.Peek(10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || s.Len() != 2 {
		t.Fatalf("after a stale Commit(%d) (err %v) of records already committed and cut, the two acknowledged records appended since "+
			"read as %q, Len %d: committed unread, lost", nextA, cerr, got, s.Len())
	}
}

// TestReviewFinalDamageCountedOnceAcrossCommits: damage before the read
// position, then a Commit that is not at the end, then later damage:
// each damaged frame is counted once (keptTo), and every intact record is
// read once in order.
func TestReviewFinalDamageCountedOnceAcrossCommits(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := func(i int) []byte { return []byte(fmt.Sprintf(`{"n":%03d}`, i)) }
	frame := int64(headerSize + len(rec(0)))
	for i := 0; i < 6; i++ {
		if err := s.Append(rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Damage frames 1 and 4 (a payload byte each).
	for _, i := range []int64{1, 4} {
		if _, err := s.f.WriteAt([]byte{'X'}, i*frame+headerSize+2); err != nil {
			t.Fatal(err)
		}
	}
	var read []string
	for round := 0; round < 10 && s.Len() > 0; round++ {
		got, next, err := s.Peek(2)
		if err != nil {
			t.Fatal(err)
		}
		// Peek again without committing: the damage is read past again.
		if _, _, err := s.Peek(2); err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			read = append(read, string(g))
		}
		if err := s.Commit(next); err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
	}
	want := []string{string(rec(0)), string(rec(2)), string(rec(3)), string(rec(5))}
	if fmt.Sprint(read) != fmt.Sprint(want) {
		t.Fatalf("read %q, want %q", read, want)
	}
	if s.Skipped() != 2*frame {
		t.Fatalf("Skipped %d, want %d: two damaged frames, each counted once", s.Skipped(), 2*frame)
	}
}
