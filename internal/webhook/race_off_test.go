//go:build !race

package webhook

// raceDetector tells tests that the race detector is on: its shadow memory
// inflates a process's RSS (not its live heap) several times.
const raceDetector = false
