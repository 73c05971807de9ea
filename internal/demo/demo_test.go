package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// childEnv makes the test binary run the demo itself, as `make demo` runs
// it, instead of the tests.
const childEnv = "ADDON_HEARTBEAT_DEMO_TEST_CHILD"

// processStart is taken at init, as controller-runtime takes the creation
// time of its global logger.
var processStart = time.Now()

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild runs the demo as a newcomer's first `make demo` does: long after
// the process started, since it first builds kube-apiserver for about 15
// minutes. controller-runtime prints its "log.SetLogger(...) was never
// called" stack trace only when its logger is used more than 30 seconds
// after the process started; waiting out those 30 seconds here is what
// makes every client the demo creates come after that mark. There is no
// event to wait for: the mark is a time.
func runChild() int {
	time.Sleep(time.Until(processStart.Add(31 * time.Second)))
	if err := Run(context.Background(), Options{Duration: 12 * time.Second, Period: time.Second}, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	return 0
}

// The demo's own lines: steps, indented notes, tables and diffs, and the
// build's progress.
var demoLine = regexp.MustCompile(`^(|==> .*|    .*|building \./cmd/[a-z-]+)$`)

// The demo, as `make demo` runs it but shorter, in a process of its own
// whose stdout and stderr go to one terminal: every step completes, the
// injected diff and the provisioned RBAC are shown, heartbeats arrive and
// follow the Deployment's availability, nothing but the demo's own lines
// is printed (no library's log, such as controller-runtime's complaint
// about an unset logger), and nothing is left behind.
func TestDemo(t *testing.T) {
	// A temporary folder of its own, to see that the demo removes its files.
	tmp := t.TempDir()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "TMPDIR="+tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the demo failed: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		"name: heartbeat-reporter",
		"addon-heartbeat.io/status",
		"RoleBinding my-addon/addon-heartbeat-reporter binds ServiceAccount my-addon-operator",
		"command: /reporter --addon-instance=addon-instance",
		"ADDON_TARGET_NAMESPACE=my-addon",
		"False Blocked",
		"True SetupComplete",
		"True DeploymentUnavailable: my-addon-operator 0/1 available",
		"False AllComponentsAvailable",
		"Stopping everything the demo started",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, text)
		}
	}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if !demoLine.MatchString(line) {
			t.Errorf("line %d is not one of the demo's own: %q", i+1, line)
		}
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("the demo left %s behind", e.Name())
	}
}
