package wsread

import (
	"encoding/binary"
	"math"
)

// Frame header bits (RFC 6455 §5.2).
const (
	finBit     = 0x80
	rsv1Bit    = 0x40
	rsvBits    = 0x70
	maskBit    = 0x80
	opCont     = 0
	opText     = 1
	opBinary   = 2
	opClose    = 8
	opPing     = 9
	opPong     = 10
	maxCtlData = 125
)

// stop says why a prefix ends.
type stop uint8

const (
	// stopShort: the prefix ends where whole frames do; the rest (if any)
	// waits for more bytes.
	stopShort stop = iota
	// stopClose: after a close frame. gorilla answers it and returns a
	// *CloseError (or a protocol error for a bad close payload).
	stopClose
	// stopBad: after the 2 bytes of a header gorilla rejects; gorilla
	// sends 1002 and returns an error.
	stopBad
	// stopTooBig: after the header of a data frame that takes the message
	// past the read limit; gorilla sends 1009 and returns ErrReadLimit.
	stopTooBig
)

// scanOpts is what gorilla's header checks depend on.
type scanOpts struct {
	server bool  // frames from the peer must be masked (we are the server)
	rsv1   bool  // compression may be negotiated: gorilla accepts RSV1
	limit  int64 // gorilla's read limit; <= 0: none
}

// batch is what a scan found: the prefix gorilla can read without waiting.
type batch struct {
	n    int  // bytes in the prefix
	msgs int  // whole data messages in it
	stop stop // why it ends
	// term: the prefix ends with control frames after its last message, so
	// a terminator must follow it for gorilla's NextReader to return.
	term bool
}

// calls is how many times ReadMessage must be called to consume the prefix
// (and the terminator): once per message, once more for the terminator or
// for the error the prefix ends in.
func (b batch) calls() int {
	if b.term || b.stop != stopShort {
		return b.msgs + 1
	}
	return b.msgs
}

// Terminators: a final, empty text frame; masked as a client sends it
// (we are the server), unmasked as a server sends it.
var (
	termMasked   = []byte{finBit | opText, maskBit, 0, 0, 0, 0}
	termUnmasked = []byte{finBit | opText, 0}
)

// scan finds the longest prefix of p made of whole control frames outside a
// message and whole messages (every fragment to FIN, control frames between
// them), ending early where gorilla would stop with an error. p starts at a
// message boundary. It mirrors gorilla v1.5.3's advanceFrame only to know
// where gorilla stops; gorilla still does the validation.
func scan(p []byte, o scanOpts) batch {
	var (
		pos, done, msgs int
		inMsg, ctlLast  bool
		msgLen          int64
	)
	short := func() batch { return batch{n: done, msgs: msgs, term: ctlLast} }
	for {
		if len(p)-pos < 2 {
			return short()
		}
		b0, b1 := p[pos], p[pos+1]
		if !headerOK(b0, b1, inMsg, o) {
			return batch{n: pos + 2, msgs: msgs, stop: stopBad}
		}
		op := b0 & 0x0f
		plen := int64(b1 & 0x7f)
		hlen := 2
		switch plen {
		case 126:
			hlen += 2
			if len(p)-pos < hlen {
				return short()
			}
			plen = int64(binary.BigEndian.Uint16(p[pos+2:]))
		case 127:
			hlen += 8
			if len(p)-pos < hlen {
				return short()
			}
			u := binary.BigEndian.Uint64(p[pos+2:])
			if u > math.MaxInt64 {
				// gorilla's setReadRemaining fails before it reads the mask.
				return batch{n: pos + hlen, msgs: msgs, stop: stopTooBig}
			}
			plen = int64(u)
		}
		if o.server {
			hlen += 4
		}
		if len(p)-pos < hlen {
			return short()
		}
		data := op == opCont || op == opText || op == opBinary
		if data {
			if plen > math.MaxInt64-msgLen || (o.limit > 0 && msgLen+plen > o.limit) {
				return batch{n: pos + hlen, msgs: msgs, stop: stopTooBig}
			}
			msgLen += plen
		}
		if int64(len(p)-pos-hlen) < plen {
			return short()
		}
		end := pos + hlen + int(plen)
		switch {
		case op == opClose:
			return batch{n: end, msgs: msgs, stop: stopClose}
		case !data:
			if !inMsg {
				done, ctlLast = end, true
			}
		case b0&finBit != 0:
			msgs++
			done, ctlLast = end, false
			inMsg, msgLen = false, 0
		default:
			inMsg = true
		}
		pos = end
	}
}

// headerOK mirrors the checks gorilla makes on a frame's first 2 bytes.
func headerOK(b0, b1 byte, inMsg bool, o scanOpts) bool {
	rsv := b0 & rsvBits
	if o.rsv1 {
		rsv &^= rsv1Bit
	}
	if rsv != 0 {
		return false
	}
	switch b0 & 0x0f {
	case opClose, opPing, opPong:
		if b1&0x7f > maxCtlData || b0&finBit == 0 {
			return false
		}
	case opText, opBinary:
		if inMsg {
			return false
		}
	case opCont:
		if !inMsg {
			return false
		}
	default:
		return false
	}
	return (b1&maskBit != 0) == o.server
}
