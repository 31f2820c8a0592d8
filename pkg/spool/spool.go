// Package spool is a durable, append-only queue of records in one local
// file: the expiry listener's holding place for timeout events while Kafka
// is unreachable.
//
// Records are appended in batches, each batch made durable by one fsync
// before Append returns. They are read back in the order written (Peek),
// and a reader marks what it has handed on (Commit). Once every record is
// committed the file is truncated to nothing. The read position is kept in
// a second small file, so a restart resumes where the last run stopped; if
// that file is lost, records are read again, never skipped.
//
// A record on disk is a frame: its length (4 bytes, big endian), the
// CRC-32C of its payload (4 bytes), then the payload. A crash in the middle
// of an append leaves a torn last frame, which Open cuts off: it was never
// acknowledged. Damage anywhere else (a bad sector, a flipped bit) costs
// only the frames it hit: reading resumes at the next intact frame, and
// the damaged bytes are kept aside for an operator.
package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MaxRecord is the largest payload a frame may hold.
const MaxRecord = 1 << 20

const headerSize = 8

// ErrFull means an append would take the spool past its size cap. Nothing
// of that append was written.
var ErrFull = errors.New("spool is full")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	dataFile   = "spool.log"
	cursorFile = "spool.pos"
	lockFile   = "spool.lock"
	// damagedFile keeps the damaged bytes reading went past.
	damagedFile = dataFile + ".damaged"
)

// Spool is an open spool directory. Its methods may be called from several
// goroutines.
type Spool struct {
	dir      string
	maxBytes int64
	lock     *os.File // holds an exclusive flock while open

	// Cut is how many unreadable bytes Open cut off the end of the file,
	// and CutFile where it kept them; zero and empty when none.
	Cut     int64
	CutFile string
	// PositionLost, when not nil, says that Open could not save the read
	// position and removed it instead: a restart reads from the start.
	PositionLost error

	// rmu is the reader's: Peek and Commit hold it for their whole run,
	// so that one reads while another commits never, even while Peek lets
	// mu go for a long search past damage (skipDamage). Taken before mu.
	rmu sync.Mutex

	mu      sync.Mutex
	f       *os.File
	size    int64 // bytes of whole frames in the file
	head    int64 // read position: frames before it are committed
	pending int   // frames at or after head; damaged ones too, until reset
	// skipped counts the damaged bytes reading has gone past (at Open or
	// since), kept in a file beside the spool (see keepDamaged).
	skipped int64
	// keptTo is the end of the damage kept aside so far, until reset.
	keptTo int64
	// peeked is the last Peek's next and the records it read up to it,
	// for Commit: past damage, next need not be a frame boundary, nor the
	// end of the file once an append followed.
	peeked       int64
	peekedFrames int
	// testSearching, when set, is called as skipDamage lets the lock go.
	testSearching func()
}

// Open opens or creates the spool in dir, taking an exclusive lock on it so
// that two processes never share one spool. maxBytes caps the file; an
// append past it fails with ErrFull. Unreadable bytes at the end of the
// file (a torn append) are cut off and kept aside; see Cut.
func Open(dir string, maxBytes int64) (*Spool, error) {
	if maxBytes < headerSize+1 {
		return nil, fmt.Errorf("spool cap %d bytes is too small", maxBytes)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("spool %s is in use by another process: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, dataFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("spool: %w", err)
	}
	s := &Spool{dir: dir, maxBytes: maxBytes, lock: lock, f: f}
	if err := s.recover(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// recover finds the intact frames in the file (damage between them
// stays, for Peek to go past), cuts off a torn tail, and restores the
// read position.
func (s *Spool) recover() error {
	data, err := io.ReadAll(s.f)
	if err != nil {
		return fmt.Errorf("spool: read %s: %w", dataFile, err)
	}
	frames, damaged, valid := scan(data)
	if valid < int64(len(data)) {
		// A torn last append, never acknowledged; or damage with no
		// intact frame after it. Either way the bytes are kept beside
		// the spool for an operator before they are cut off.
		s.Cut = int64(len(data)) - valid
		s.CutFile = filepath.Join(s.dir, fmt.Sprintf("%s.cut-%d", dataFile, time.Now().UnixNano()))
		if err := os.WriteFile(s.CutFile, data[valid:], 0o600); err != nil {
			return fmt.Errorf("spool: keep the unreadable tail: %w", err)
		}
		if err := s.f.Truncate(valid); err != nil {
			return fmt.Errorf("spool: cut torn tail: %w", err)
		}
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("spool: sync: %w", err)
		}
	}
	s.size = valid
	// The saved position is used only if it falls on a frame boundary (an
	// intact frame's, or a damaged one's, which reading goes past);
	// anything else means it is stale, and reading from the start again
	// repeats records rather than losing them.
	head := readCursor(filepath.Join(s.dir, cursorFile))
	s.head = 0
	if head == valid || slices.Contains(frames, head) || slices.ContainsFunc(damaged, func(d span) bool { return d.from == head }) {
		s.head = head
	}
	for _, off := range frames {
		if off >= s.head {
			s.pending++
		}
	}
	// Damage between intact frames stays in place: Peek goes past it,
	// keeping it aside, when reading gets there.
	err = nil
	if s.pending == 0 && s.size > 0 {
		err = s.reset()
	} else if s.head != head {
		// The saved position is not this file's: replace it now, before
		// appends could make it look like one.
		err = s.saveCursor(s.head, true)
	}
	if errors.Is(err, errPositionRemoved) {
		// Done, as far as it matters: no stale position is left. The
		// next Commit tries to save one again.
		s.PositionLost = err
		return nil
	}
	return err
}

func readCursor(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// Scan returns the offsets of the intact frames in data, in order, and
// how many bytes they span: up to the end of the last intact frame, past
// any damage between intact frames (see scan). The bytes after it are a
// torn tail, or damage no intact frame follows.
func Scan(data []byte) (offsets []int64, valid int64) {
	offsets, _, valid = scan(data)
	return offsets, valid
}

// span is a range of bytes of the file, [from, to).
type span struct{ from, to int64 }

// scan walks data frame by frame. A frame that is not intact (torn,
// oversized, failing its checksum) is damage, up to the next offset at
// which an intact frame starts: reading resumes there. Damage that no
// intact frame follows ends the valid bytes.
func scan(data []byte) (offsets []int64, damaged []span, valid int64) {
	var off int64
	for off < int64(len(data)) {
		if n, ok := frameAt(data, off); ok {
			offsets = append(offsets, off)
			off += headerSize + n
			valid = off
			continue
		}
		next := nextFrame(data, off+1, int64(len(data)))
		if next < 0 {
			break
		}
		damaged = append(damaged, span{off, next})
		off = next
	}
	return offsets, damaged, valid
}

// frameAt reports whether an intact frame starts at off in data, and its
// payload's length.
func frameAt(data []byte, off int64) (n int64, ok bool) {
	if int64(len(data))-off < headerSize {
		return 0, false
	}
	n = int64(binary.BigEndian.Uint32(data[off:]))
	// Zero-length frames are never written, and a zero-filled stretch
	// (CRC-32C of nothing is 0) must not read as records.
	if n == 0 || n > MaxRecord || int64(len(data))-off-headerSize < n {
		return 0, false
	}
	sum := binary.BigEndian.Uint32(data[off+4:])
	return n, crc32.Checksum(data[off+headerSize:off+headerSize+n], castagnoli) == sum
}

// nextFrame is the first offset in [from, limit) at which an intact frame
// starts in data, or -1. A false one inside damaged bytes would need a
// length under MaxRecord (a zero first byte, which the JSON records never
// hold) and a matching checksum.
func nextFrame(data []byte, from, limit int64) int64 {
	for off := from; off < limit && int64(len(data))-off >= headerSize; off++ {
		if data[off] != 0 {
			continue
		}
		if _, ok := frameAt(data, off); ok {
			return off
		}
	}
	return -1
}

// AppendFrame appends the frame of payload to dst.
func AppendFrame(dst, payload []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	dst = binary.BigEndian.AppendUint32(dst, crc32.Checksum(payload, castagnoli))
	return append(dst, payload...)
}

// Append writes records at the end of the spool and syncs them to disk.
// Either all are durable when it returns nil, or none counts: on an error
// the file is cut back to where it was.
func (s *Spool) Append(records ...[]byte) error {
	if len(records) == 0 {
		return nil
	}
	var buf []byte
	for _, r := range records {
		if len(r) == 0 {
			return errors.New("spool: empty record")
		}
		if len(r) > MaxRecord {
			return fmt.Errorf("spool: record of %d bytes is over the %d-byte limit", len(r), MaxRecord)
		}
		buf = AppendFrame(buf, r)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return errors.New("spool: closed")
	}
	if s.size+int64(len(buf)) > s.maxBytes {
		return ErrFull
	}
	if _, err := s.f.WriteAt(buf, s.size); err != nil {
		s.f.Truncate(s.size)
		return fmt.Errorf("spool: write: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		s.f.Truncate(s.size)
		return fmt.Errorf("spool: sync: %w", err)
	}
	s.size += int64(len(buf))
	s.pending += len(records)
	return nil
}

// Peek returns up to max records from the read position, oldest first,
// and the position after them, to pass to Commit once they are handed on.
// A damaged frame (one whose bytes changed since they were written) is
// gone past, to the next intact one, and kept aside; Skipped counts it.
func (s *Spool) Peek(max int) (records [][]byte, next int64, err error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil, 0, errors.New("spool: closed")
	}
	off := s.head
	var hdr [headerSize]byte
	for len(records) < max && off < s.size {
		if _, err := s.f.ReadAt(hdr[:], off); err != nil {
			return nil, 0, fmt.Errorf("spool: read at %d: %w", off, err)
		}
		n := int64(binary.BigEndian.Uint32(hdr[:4]))
		if n > 0 && n <= MaxRecord && off+headerSize+n <= s.size {
			payload := make([]byte, n)
			if _, err := s.f.ReadAt(payload, off+headerSize); err != nil {
				return nil, 0, fmt.Errorf("spool: read at %d: %w", off, err)
			}
			if crc32.Checksum(payload, castagnoli) == binary.BigEndian.Uint32(hdr[4:]) {
				records = append(records, payload)
				off += headerSize + n
				continue
			}
		}
		if off, err = s.skipDamage(off); err != nil {
			return nil, 0, err
		}
	}
	s.peeked, s.peekedFrames = off, len(records)
	return records, off, nil
}

// skipDamage goes past the damaged frame at off, to the next intact frame
// or the end of the file, keeps the bytes in between aside and counts
// them, and returns where reading resumes. It reads a window at a time,
// each with room for a whole frame starting at its last byte. s.mu is
// held, and let go during the search, which may take long (see
// nextFrame): appends only write past the bytes it reads, and the reader
// that cuts the file (Commit) waits on s.rmu, which the caller holds.
func (s *Spool) skipDamage(off int64) (int64, error) {
	const window = 1 << 20
	f, size := s.f, s.size
	s.mu.Unlock()
	if s.testSearching != nil {
		s.testSearching()
	}
	to, err := size, error(nil)
	for from := off + 1; from < size; from += window {
		buf := make([]byte, min(size, from+window+headerSize+MaxRecord)-from)
		if _, err = f.ReadAt(buf, from); err != nil {
			err = fmt.Errorf("spool: read at %d: %w", from, err)
			break
		}
		if next := nextFrame(buf, 0, window); next >= 0 {
			to = from + next
			break
		}
	}
	s.mu.Lock()
	if err == nil && s.f == nil {
		err = errors.New("spool: closed")
	}
	if err != nil {
		return 0, err
	}
	s.keepDamaged(off, to)
	return to, nil
}

// keepDamaged counts the damaged bytes [from, to) of the file, which
// reading goes past, and appends them to the file beside the spool that
// keeps them for an operator; bytes a Peek went past before (one whose
// records were not committed, read again) are not counted or kept again.
// Failing to keep them does not stop reading past them: the events after
// the damage matter more than the copy. s.mu is held.
func (s *Spool) keepDamaged(from, to int64) {
	from = max(from, s.keptTo)
	if to <= from {
		return
	}
	s.keptTo = to
	s.skipped += to - from
	f, err := os.OpenFile(filepath.Join(s.dir, damagedFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	io.Copy(f, io.NewSectionReader(s.f, from, to-from))
}

// DamagedFile is the file that keeps the damaged bytes reading went past.
func (s *Spool) DamagedFile() string { return filepath.Join(s.dir, damagedFile) }

// Skipped is how many damaged bytes reading has gone past since Open,
// kept in DamagedFile.
func (s *Spool) Skipped() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skipped
}

// Commit moves the read position to next, as returned by the last Peek;
// any other is refused, the records read again by the next Peek. When
// that is the end of the spool, the file is truncated to nothing. A position
// that cannot be saved is removed instead, so that a restart reads again
// from the start (the same events, which downstream collapses) rather
// than from a stale one; the error says so, and the spool goes on.
func (s *Spool) Commit(next int64) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return errors.New("spool: closed")
	}
	if next < s.head || next > s.size {
		return fmt.Errorf("spool: commit to %d outside [%d, %d]", next, s.head, s.size)
	}
	if next == s.head {
		return nil
	}
	if next != s.peeked {
		// Not the last Peek's: an older one's, or one from before the file
		// was cut (reset), which could fall on a boundary of records
		// appended since and skip them.
		return fmt.Errorf("spool: commit to %d is not the last Peek's (%d)", next, s.peeked)
	}
	frames := s.peekedFrames
	s.head = next
	s.pending = max(s.pending-frames, 0)
	s.peeked, s.peekedFrames = 0, 0
	if s.head == s.size {
		// Nothing is pending, whatever reset does: damaged frames Append
		// counted are read past too.
		s.pending = 0
		return s.reset()
	}
	return s.saveCursor(s.head, false)
}

// reset empties the file once everything in it is committed. The
// position is cleared, durably, before the file is cut: a position left
// from an emptied file could otherwise fall on a frame boundary of records
// appended later and skip them, while a crash between the two steps here
// only replays committed records. A position that cannot be written is
// removed (see saveCursor); only when neither works is the file left
// whole, read to its end.
func (s *Spool) reset() error {
	err := s.saveCursor(0, true)
	if err != nil && !errors.Is(err, errPositionRemoved) {
		return err
	}
	if terr := s.f.Truncate(0); terr != nil {
		return fmt.Errorf("spool: truncate: %w", terr)
	}
	// Cut, synced or not: the next append goes at the start, not past a
	// hole a restart would take for damage.
	s.size, s.head, s.pending, s.keptTo = 0, 0, 0, 0
	if serr := s.f.Sync(); serr != nil {
		return fmt.Errorf("spool: sync: %w", serr)
	}
	return err
}

// errPositionRemoved means the read position could not be saved, and its
// file was removed instead: a restart reads from the start.
var errPositionRemoved = errors.New("removed it instead: a restart reads the spool from its start")

// saveCursor saves the read position (writeCursor), or, when it cannot be
// written (the directory takes no new file), removes the one saved, which
// needs none, so that no stale position outlives this one: a restart
// then reads from the start, repeating records, never skipping them. The
// error wraps errPositionRemoved when the removal worked.
func (s *Spool) saveCursor(head int64, sync bool) error {
	err := s.writeCursor(head, sync)
	if err == nil {
		return nil
	}
	path := filepath.Join(s.dir, cursorFile)
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return errors.Join(err, fmt.Errorf("spool: remove read position: %w", rerr))
	}
	if sync {
		// Not durably gone, an old position could come back after a
		// crash over a file cut and filled again, and skip records.
		if serr := syncDir(s.dir); serr != nil {
			return errors.Join(err, fmt.Errorf("spool: sync removal of read position: %w", serr))
		}
	}
	return fmt.Errorf("%w; %w", err, errPositionRemoved)
}

// writeCursor saves the read position through a temporary file and a
// rename, so it is never half written. A position saved without sync may
// be lost to a crash, leaving an older one: that replays records, never
// skips them.
func (s *Spool) writeCursor(head int64, sync bool) error {
	path := filepath.Join(s.dir, cursorFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("spool: save read position: %w", err)
	}
	_, err = f.WriteString(strconv.FormatInt(head, 10))
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil && sync {
		err = syncDir(s.dir)
	}
	if err != nil {
		return fmt.Errorf("spool: save read position: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Len is the number of records not yet committed.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending
}

// Size is the file's size in bytes, committed records included until the
// spool empties.
func (s *Spool) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Full reports whether the spool is at its cap, within a reserve of a
// quarter of it or 64 KiB, whichever is less: room for a batch in flight.
func (s *Spool) Full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size+min(s.maxBytes/4, 64<<10) > s.maxBytes
}

// Close closes the file and releases the lock. Uncommitted records stay
// for the next Open.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.f != nil {
		err = s.f.Close()
		s.f = nil
	}
	if s.lock != nil {
		s.lock.Close() // releases the flock
		s.lock = nil
	}
	return err
}
