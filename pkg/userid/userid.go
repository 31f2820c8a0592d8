// Package userid holds the contract's rules for naming a user and a
// segment, which the token, the push call, the policy and the Redis model
// all check. It imports nothing of the project, so a contract package
// that checks a uid does not import the Redis model.
package userid

import "regexp"

// DefaultSegment is the segment of a session whose token names none.
const DefaultSegment = "default"

var (
	uidRE     = regexp.MustCompile(`^[A-Za-z0-9._:@-]{1,128}$`)
	segmentRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// Valid reports whether uid is a user id the contract allows:
// 1-128 characters of [A-Za-z0-9._:@-].
func Valid(uid string) bool { return uidRE.MatchString(uid) }

// ValidSegment reports whether seg is 1-64 characters of [A-Za-z0-9._-].
func ValidSegment(seg string) bool { return segmentRE.MatchString(seg) }
