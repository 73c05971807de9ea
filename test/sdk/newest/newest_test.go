// Package newest runs test/sdk/addon's checks at the newest controller-runtime,
// k8s.io and Go releases the SDK supports (those of the main module).
package newest

import (
	"testing"

	"github.com/addon-heartbeat/addon-heartbeat/test/sdk/addon/compat"
)

func TestManagerReportsAtTheNewestReleases(t *testing.T) {
	compat.ManagerReports(t)
}

func TestKeepsItsVersions(t *testing.T) {
	compat.KeepsItsVersions(t, ".")
}
