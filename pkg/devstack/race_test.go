//go:build race

package devstack

// raceDetector: the race detector slows the services about tenfold, and
// a bound on how fast a burst of guides drains allows for it.
const raceDetector = true
