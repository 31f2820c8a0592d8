//go:build !race

package devstack

const raceDetector = false
