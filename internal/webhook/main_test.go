package webhook

import (
	"os"
	"testing"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// lazyEnv starts the API server on first use, so the unit and fuzz tests
// run without it.
var lazyEnv testenv.Lazy

func testEnv(t *testing.T) *testenv.Environment {
	t.Helper()
	return lazyEnv.Get(t)
}

func TestMain(m *testing.M) { os.Exit(lazyEnv.Main(m)) }
