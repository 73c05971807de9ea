package release

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
)

// headingRE is a version's heading in CHANGELOG.md: "## [v1.2.3] - 2026-12-04"
// or "## v1.2.3".
var headingRE = regexp.MustCompile(`^## \[?(v[^\]\s]+)\]?`)

// Notes is the section of changelog for v, without its heading: the release
// notes. An error says what is missing.
func Notes(changelog []byte, v string) (string, error) {
	var (
		body  []string
		found bool
	)
	for _, line := range strings.Split(string(changelog), "\n") {
		if m := headingRE.FindStringSubmatch(line); m != nil {
			if found {
				break
			}
			found = m[1] == v
			continue
		}
		if found {
			body = append(body, line)
		}
	}
	notes := strings.TrimSpace(strings.Join(body, "\n"))
	switch {
	case !found:
		return "", fmt.Errorf("CHANGELOG.md has no section for %s: add a heading \"## [%s] - YYYY-MM-DD\" and what changed", v, v)
	case notes == "":
		return "", fmt.Errorf("CHANGELOG.md: the section for %s is empty: say what changed", v)
	}
	return notes + "\n", nil
}

// Latest is the newest version in changelog: the first heading that names a
// semantic version.
func Latest(changelog []byte) (string, error) {
	for _, line := range strings.Split(string(changelog), "\n") {
		if m := headingRE.FindStringSubmatch(line); m != nil && version.IsSemver(m[1]) {
			return m[1], nil
		}
	}
	return "", fmt.Errorf("CHANGELOG.md names no version (a heading such as \"## [v0.1.0] - 2026-12-04\")")
}
