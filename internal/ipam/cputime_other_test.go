//go:build !unix

package ipam

import "testing"

// cpuMark reports nothing where getrusage is not available.
type cpuMark struct{}

func cpuStart() cpuMark { return cpuMark{} }

func (cpuMark) report(*testing.B) {}
