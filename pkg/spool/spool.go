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
// acknowledged.
package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
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

	mu      sync.Mutex
	f       *os.File
	size    int64 // bytes of whole frames in the file
	head    int64 // read position: frames before it are committed
	pending int   // frames at or after head
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

// recover finds the whole frames in the file, cuts off a torn tail, and
// restores the read position.
func (s *Spool) recover() error {
	data, err := io.ReadAll(s.f)
	if err != nil {
		return fmt.Errorf("spool: read %s: %w", dataFile, err)
	}
	frames, valid := Scan(data)
	if valid < int64(len(data)) {
		// A torn last append, never acknowledged; or, if whole frames
		// follow, damage. Either way the bytes are kept beside the spool
		// for an operator before they are cut off.
		s.Cut = int64(len(data)) - valid
		s.CutFile = filepath.Join(s.dir, fmt.Sprintf("%s.cut-%d", dataFile, time.Now().UnixNano()))
		if err := os.WriteFile(s.CutFile, data[valid:], 0o600); err != nil {
			return fmt.Errorf("spool: keep the unreadable tail: %w", err)
		}
		if err := s.f.Truncate(valid); err != nil {
			return fmt.Errorf("spool: cut torn tail: %w", err)
		}
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("spool: %w", err)
		}
	}
	s.size = valid
	// The saved position is used only if it falls on a frame boundary;
	// anything else means it is stale, and reading from the start again
	// repeats records rather than losing them.
	head := readCursor(filepath.Join(s.dir, cursorFile))
	s.head, s.pending = 0, len(frames)
	for i, off := range frames {
		if off == head {
			s.head, s.pending = head, len(frames)-i
			break
		}
	}
	if head == valid {
		s.head, s.pending = valid, 0
	}
	if s.pending == 0 && s.size > 0 {
		return s.reset()
	}
	if s.head != head {
		// The saved position is not this file's: replace it now, before
		// appends could make it look like one.
		return s.writeCursor(s.head, true)
	}
	return nil
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

// Scan returns the offsets of the whole, intact frames at the start of
// data, and how many bytes they span. It stops at the first frame that is
// torn, oversized or fails its checksum.
func Scan(data []byte) (offsets []int64, valid int64) {
	var off int64
	for int64(len(data))-off >= headerSize {
		n := int64(binary.BigEndian.Uint32(data[off:]))
		sum := binary.BigEndian.Uint32(data[off+4:])
		// Zero-length frames are never written, and a zero-filled tail
		// (CRC-32C of nothing is 0) must not read as records.
		if n == 0 || n > MaxRecord || int64(len(data))-off-headerSize < n {
			break
		}
		payload := data[off+headerSize : off+headerSize+n]
		if crc32.Checksum(payload, castagnoli) != sum {
			break
		}
		offsets = append(offsets, off)
		off += headerSize + n
	}
	return offsets, off
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
func (s *Spool) Peek(max int) (records [][]byte, next int64, err error) {
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
		if n > MaxRecord || off+headerSize+n > s.size {
			return nil, 0, fmt.Errorf("spool: bad frame at %d", off)
		}
		payload := make([]byte, n)
		if _, err := s.f.ReadAt(payload, off+headerSize); err != nil {
			return nil, 0, fmt.Errorf("spool: read at %d: %w", off, err)
		}
		if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(hdr[4:]) {
			return nil, 0, fmt.Errorf("spool: checksum mismatch at %d", off)
		}
		records = append(records, payload)
		off += headerSize + n
	}
	return records, off, nil
}

// Commit moves the read position to next, as returned by Peek. When that
// is the end of the spool, the file is truncated to nothing.
func (s *Spool) Commit(next int64) error {
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
	data := make([]byte, next-s.head)
	if _, err := s.f.ReadAt(data, s.head); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	frames, valid := Scan(data)
	if valid != int64(len(data)) {
		return fmt.Errorf("spool: commit to %d is not on a frame boundary", next)
	}
	s.head = next
	s.pending -= len(frames)
	if s.head == s.size {
		return s.reset()
	}
	return s.writeCursor(s.head, false)
}

// reset empties the file once everything in it is committed. The
// position is cleared, durably, before the file is cut: a position left
// from an emptied file could otherwise fall on a frame boundary of records
// appended later and skip them, while a crash between the two steps here
// only replays committed records.
func (s *Spool) reset() error {
	if err := s.writeCursor(0, true); err != nil {
		return err
	}
	if err := s.f.Truncate(0); err != nil {
		return fmt.Errorf("spool: truncate: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("spool: sync: %w", err)
	}
	s.size, s.head, s.pending = 0, 0, 0
	return nil
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
		return fmt.Errorf("spool: %w", err)
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
