// Package version says which build of addon-heartbeat a binary is: the
// release version stamped at link time by the release build (LDFlags), or
// else what the Go toolchain recorded in the binary (the module version it
// derives from the VCS, the commit, whether the tree was modified). Both
// binaries print it for --version, log it when they start and export it as
// the addon_heartbeat_build_info metric.
package version

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set at link time by the release build: -X <this package>.version=v1.2.3
// -X <this package>.revision=<commit>. Empty in other builds.
var (
	version  string
	revision string
)

// Package is this package's import path, for -X flags.
const Package = "github.com/addon-heartbeat/addon-heartbeat/internal/version"

// Devel is the version of a build that carries none (go test, go run).
const Devel = "devel"

// Info describes a build.
type Info struct {
	// Version is a release version (v1.2.3), a Go pseudo-version of the
	// commit (v0.0.0-20261204002612-2f4a617abcde, +dirty when the tree was
	// modified), or Devel.
	Version string
	// Revision is the commit the binary was built from; empty when unknown.
	Revision  string
	GoVersion string
	// Platform is GOOS/GOARCH.
	Platform string
}

// LDFlags are the linker flags that stamp a release version and revision.
func LDFlags(version, revision string) string {
	var f []string
	if version != "" {
		f = append(f, "-X "+Package+".version="+version)
	}
	if revision != "" {
		f = append(f, "-X "+Package+".revision="+revision)
	}
	return strings.Join(f, " ")
}

// Get is this binary's build.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(version, revision, bi)
}

// get is Get for the stamped values and the build info given (nil when the
// binary has none).
func get(stampedVersion, stampedRevision string, bi *debug.BuildInfo) Info {
	info := Info{Version: stampedVersion, Revision: stampedRevision, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		if info.Version == "" {
			info.Version = Devel
		}
		return info
	}
	info.GoVersion = bi.GoVersion
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if info.Version == "" {
		// Go derives the main module's version from the VCS (a tag, or a
		// pseudo-version of the commit); "(devel)" when it had none.
		info.Version = bi.Main.Version
		if info.Version == "" || info.Version == "(devel)" {
			info.Version = Devel
		}
	}
	if info.Revision == "" {
		info.Revision = settings["vcs.revision"]
		if info.Revision != "" && settings["vcs.modified"] == "true" {
			info.Revision += "-dirty"
		}
	}
	if goos, goarch := settings["GOOS"], settings["GOARCH"]; goos != "" && goarch != "" {
		info.Platform = goos + "/" + goarch
	}
	return info
}

// String is one line: "addon-heartbeat <component> v1.2.3 (revision ..., go1.26.8, linux/arm64)".
func (i Info) String() string {
	rev := i.Revision
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("%s (revision %s, %s, %s)", i.Version, rev, i.GoVersion, i.Platform)
}

// KeysAndValues are the info as logr key/value pairs, for the startup line.
func (i Info) KeysAndValues() []any {
	return []any{"version", i.Version, "revision", i.Revision, "goVersion", i.GoVersion, "platform", i.Platform}
}

// semverRE is a semantic version with the v prefix Go and the chart's
// appVersion use.
var semverRE = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

// IsSemver reports whether v is a semantic version such as v1.2.3 or
// v1.3.0-rc.1.
func IsSemver(v string) bool { return semverRE.MatchString(v) }

// ImageVersion is the version an image reference names by its tag
// (repository:v1.2.3, or repository:v1.2.3@sha256:...), and whether it names
// one: a reference by digest alone, or a tag that is no semantic version
// (such as latest or a branch name), names none.
func ImageVersion(ref string) (string, bool) {
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	i := strings.LastIndexByte(ref, ':')
	if i < 0 || strings.Contains(ref[i:], "/") {
		return "", false // no tag (the colon, if any, was a registry port)
	}
	tag := ref[i+1:]
	return tag, IsSemver(tag)
}

// ReporterMismatch says why the reporter's version does not match the
// webhook's own, or returns "" when it matches or either version cannot be
// told (a development build, or a reporter image by digest or with a tag
// that is no version, and no reporterVersion given), in which case known is
// false. reporterVersion is the release the reporter image is of, as the
// chart declares it; when empty, the version the image's tag names.
func ReporterMismatch(webhookVersion, reporterVersion, reporterImage string) (msg string, known bool) {
	rv, ok := reporterVersion, IsSemver(reporterVersion)
	if reporterVersion == "" {
		rv, ok = ImageVersion(reporterImage)
	}
	if !ok || !IsSemver(webhookVersion) {
		return "", false
	}
	if rv == webhookVersion {
		return "", true
	}
	return fmt.Sprintf("the injected heartbeat reporter image %s is version %s, the webhook is %s: "+
		"the chart's image and reporter.image should be of the same release", reporterImage, rv, webhookVersion), true
}
