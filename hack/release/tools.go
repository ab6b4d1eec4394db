//go:build tools

// Package tools pins the syft and cosign commands so that `go mod tidy`
// keeps github.com/anchore/syft and github.com/sigstore/cosign/v2, and
// everything both commands import, in this module's requirements.
package tools

import (
	_ "github.com/anchore/syft/cmd/syft"
	_ "github.com/sigstore/cosign/v2/cmd/cosign"
)
