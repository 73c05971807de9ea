package admission

import (
	"github.com/go-logr/logr"

	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
)

// ReporterVersionWarning compares the reporter's version (the declared one,
// or else the one its image's tag names) with the webhook's own, logs the outcome once, and returns the
// admission warning to give every review that injects the reporter (empty
// when they match or cannot be compared). A webhook and a reporter of
// different releases work together (upgrades roll them out one after the
// other), but a lasting difference is a chart whose image and reporter.image
// were set apart by mistake, such as a mirrored digest of another release.
// The log reaches the admin who runs the webhook; the warning reaches
// whoever applies an addon (kubectl prints it, GitOps tools record it) at
// the moment a reporter of the other version goes into their pods.
func ReporterVersionWarning(log logr.Logger, reporterVersion, reporterImage string) string {
	own := version.Get().Version
	msg, known := version.ReporterMismatch(own, reporterVersion, reporterImage)
	switch {
	case !known:
		log.Info("reporter image version not compared with the webhook's: one of them names no release version",
			"webhookVersion", own, "reporterVersion", reporterVersion, "reporterImage", reporterImage)
	case msg != "":
		log.Error(nil, "reporter image version differs from the webhook's", "webhookVersion", own,
			"reporterImage", reporterImage, "warning", msg)
	}
	return msg
}
