package rbac_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/rbac"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// The chart's values for this suite: the default AddonInstance name plus
// one more, and namespaces labelled example.com/addons=disabled left out.
const chartValues = `
reporter:
  addonInstanceNames: [addon-instance, second]
webhook:
  namespaceSelector:
    matchExpressions:
    - {key: example.com/addons, operator: NotIn, values: [disabled]}
`

// One kube-apiserver + etcd for the package, with the chart's RBAC objects
// installed and the RBAC controller running as the webhook's ServiceAccount,
// with only the permissions the chart gives it, leader-elected on the
// chart's Lease as in a cluster.
var (
	env         *testenv.Environment
	k8s         client.Client
	clientset   *kubernetes.Clientset
	testTimeout = 30 * time.Second
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RunSuite(m, logging.LevelError, testenv.Options{}, func(s *testenv.Suite) (func() error, error) {
		env, k8s = s.Env, s.Client
		clientset = kubernetes.NewForConfigOrDie(env.Config)
		ctx, cancel := context.WithCancel(context.Background())
		cfg, err := installChart(ctx)
		if err != nil {
			cancel()
			return nil, err
		}
		done := make(chan error, 1)
		go func() { done <- runController(ctx, cfg, s.Log) }()
		return func() error {
			cancel()
			if err := <-done; err != nil {
				return fmt.Errorf("controller: %w", err)
			}
			return nil
		}, nil
	}))
}

// installChart creates the release namespace and the chart's RBAC objects,
// and returns the controller's configuration from the rendered Deployment's
// --namespace-selector.
func installChart(ctx context.Context) (rbac.Config, error) {
	vals := map[string]any{}
	if err := yamlUnmarshal(chartValues, &vals); err != nil {
		return rbac.Config{}, err
	}
	objs, _, err := chart.Render(chart.DefaultRelease, vals)
	if err != nil {
		return rbac.Config{}, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chart.DefaultRelease.Namespace}}
	if err := k8s.Create(ctx, ns); err != nil {
		return rbac.Config{}, err
	}
	var args []string
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := k8s.Create(ctx, o); err != nil {
				return rbac.Config{}, fmt.Errorf("creating %s: %w", chart.Key(o), err)
			}
		case "Deployment":
			var dep appsv1.Deployment
			if err := fromUnstructured(o.Object, &dep); err != nil {
				return rbac.Config{}, err
			}
			for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
				args = append(args, strings.ReplaceAll(a, "$(POD_NAMESPACE)", dep.Namespace))
			}
		}
	}
	// The webhook binary's own flags and validation turn the chart's args
	// into the controller's configuration.
	o := webhook.DefaultOptions()
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return rbac.Config{}, fmt.Errorf("parsing the chart's args: %w", err)
	}
	cfg, ok, err := o.RBACConfig()
	if err != nil || !ok {
		return rbac.Config{}, fmt.Errorf("the chart's args give no RBAC configuration (%v)", err)
	}
	// The webhook loads its key from a Secret; here it is fixed, and the
	// tests sign their records with it as the webhook would.
	cfg.Key = func() []byte { return recordKey }
	return cfg, nil
}

const (
	webhookSA      = "system:serviceaccount:addon-heartbeat-system:addon-heartbeat"
	leaderElection = "addon-heartbeat-webhook"
)

// runController runs the controller as the webhook does, impersonating the
// webhook's ServiceAccount.
func runController(ctx context.Context, cfg rbac.Config, log logrLogger) error {
	restCfg := rest.CopyConfig(env.Config)
	restCfg.Impersonate = rest.ImpersonationConfig{
		UserName: webhookSA,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:addon-heartbeat-system", "system:authenticated"},
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                        testenv.Scheme(),
		Logger:                        log,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              leaderElection,
		LeaderElectionNamespace:       chart.DefaultRelease.Namespace,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         cache.Options{ByObject: cfg.CacheOptions()},
	})
	if err != nil {
		return err
	}
	r := &rbac.Reconciler{Client: mgr.GetClient(), Config: cfg, Log: log}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// newNamespace creates a namespace with labels for one test.
func newNamespace(t *testing.T, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "addon-", Labels: labels}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}

// recordKey is the suite's record signing key.
var recordKey = []byte("the rbac suite's signing key, 32")

// injected is a minimal Deployment running as sa (the namespace's default
// when empty) as the webhook admits it for instance: injected, with the
// status record signed.
func injected(t *testing.T, ns, name, sa, instance string) *appsv1.Deployment {
	t.Helper()
	d := addon(ns, name, sa, map[string]string{annotations.Inject: "true", annotations.AddonInstance: instance})
	return admit(t, d)
}

// admit is what the webhook does to d at admission: d becomes the mutated
// Deployment.
func admit(t *testing.T, d *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	cfg := inject.DefaultConfig()
	cfg.Image = "registry.example.com/reporter:v1"
	cfg.RecordKey = recordKey
	res, err := inject.Mutate(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res.Deployment
}

// newAddonInstance creates AddonInstance name in ns, as the operator does
// in an addon's namespace.
func newAddonInstance(t *testing.T, ns, name string) *addonsv1alpha1.AddonInstance {
	t.Helper()
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: 10 * time.Second}}}
	if err := k8s.Create(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	return ai
}

// addonNamespace is a new namespace holding AddonInstance "addon-instance".
func addonNamespace(t *testing.T, labels map[string]string) string {
	t.Helper()
	ns := newNamespace(t, labels)
	newAddonInstance(t, ns, "addon-instance")
	return ns
}

// addon is a minimal Deployment running as sa, with annotations.
func addon(ns, name, sa string, annots map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annots},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: sa,
					Containers:         []corev1.Container{{Name: "manager", Image: "registry.example.com/addon:v1"}},
				},
			},
		},
	}
}

// poll waits for cond, failing the test with what it last saw.
func poll(t *testing.T, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, testTimeout, true, func(ctx context.Context) (bool, error) {
		ok, seen := cond(ctx)
		last = seen
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last: %s)", what, err, last)
	}
}
