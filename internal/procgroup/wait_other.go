//go:build !linux && !windows

package procgroup

import "errors"

// waitExited cannot wait without reaping here: see Leader.Wait.
func waitExited(int) error { return errors.ErrUnsupported }
