// Package userid holds the contract's rules for naming a user and a
// segment, which the token, the push call, the policy and the Redis model
// all check. It imports nothing of the project, so a contract package
// that checks a uid does not import the Redis model.
package userid

// DefaultSegment is the segment of a session whose token names none.
const DefaultSegment = "default"

// Valid reports whether uid is a user id the contract allows:
// 1-128 characters of [A-Za-z0-9._:@-].
func Valid(uid string) bool { return valid(uid, 128, true) }

// ValidSegment reports whether seg is 1-64 characters of [A-Za-z0-9._-].
func ValidSegment(seg string) bool { return valid(seg, 64, false) }

// valid reports whether s is 1 to max characters of [A-Za-z0-9._-], and
// of ':' and '@' too with colonAt. Every one is a byte: a longer
// character is none of them. A loop, not a regexp: every activity event
// and every renewal checks a uid.
func valid(s string, max int, colonAt bool) bool {
	if len(s) < 1 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		case colonAt && (c == ':' || c == '@'):
		default:
			return false
		}
	}
	return true
}
