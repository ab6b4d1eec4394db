//go:build tools

// Package tools pins the spire-server and spire-agent commands so that
// `go mod tidy` keeps github.com/spiffe/spire, and everything both commands
// import, in this module's requirements.
package tools

import (
	_ "github.com/spiffe/spire/cmd/spire-agent"
	_ "github.com/spiffe/spire/cmd/spire-server"
)
