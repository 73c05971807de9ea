// Command scc-webhook is a mutating admission webhook for core/v1 Pods (CREATE) that applies
// OpenShift's Security Context Constraints, with OpenShift's own admission plugin (package
// sccadmit), on a cluster that has none: a plain Kubernetes node then admits or refuses the
// addon's pods as an OpenShift cluster would, and runs them with the security contexts that
// OpenShift would assign.
//
// Only pods in namespaces annotated openshift.io/sa.scc.uid-range are handled (they also need
// openshift.io/sa.scc.mcs, and supplemental-groups or the uid-range serves for groups, as on
// OpenShift); every other pod passes unchanged. Every ServiceAccount may use --default-scc
// (restricted-v2, as the ClusterRoleBinding system:openshift:scc:restricted-v2 grants it to
// system:authenticated); a namespace labelled scc.addon-heartbeat.io/<scc>: "true" also grants
// <scc> (e.g. scc.addon-heartbeat.io/anyuid: "true") to every pod in it, as
// `oc adm policy add-scc-to-user anyuid -z <sa>` would. Among the SCCs a pod may use, the plugin
// picks by priority, then restrictiveness, like OpenShift.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/addon-heartbeat/addon-heartbeat/test/openshift/sccadmit"
)

// GrantLabelPrefix + an SCC name, set to "true" on a namespace, grants that SCC to its pods.
const GrantLabelPrefix = "scc.addon-heartbeat.io/"

func main() {
	listen := flag.String("listen", "127.0.0.1:9443", "address to serve HTTPS on")
	cert := flag.String("cert", "", "TLS certificate file (PEM)")
	key := flag.String("key", "", "TLS key file (PEM)")
	sccDir := flag.String("scc-dir", "", "folder of SecurityContextConstraints YAML files")
	defaultSCC := flag.String("default-scc", "restricted-v2", "the SCC every ServiceAccount may use")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig to read Namespaces with (default: in-cluster)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	if err := run(*listen, *cert, *key, *sccDir, *defaultSCC, *kubeconfig); err != nil {
		log.Fatal(err)
	}
}

func run(listen, cert, key, sccDir, defaultSCC, kubeconfig string) error {
	if cert == "" || key == "" || sccDir == "" {
		return errors.New("--cert, --key and --scc-dir are required")
	}
	sccs, err := sccadmit.LoadSCCs(sccDir)
	if err != nil {
		return err
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	admitter, err := sccadmit.New(ctx, sccs, kube, Grants(defaultSCC))
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/mutate-pods", &Handler{Kube: kube, Admitter: admitter})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	server := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	errs := make(chan error, 1)
	go func() { errs <- server.ListenAndServeTLS(cert, key) }()
	log.Printf("serving /mutate-pods on https://%s (SCCs from %s, default %s)", listen, sccDir, defaultSCC)
	select {
	case err := <-errs:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := server.Shutdown(shutdown); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// Grants gives defaultSCC to every pod, and an SCC named by a namespace's label
// scc.addon-heartbeat.io/<name>: "true" to the pods of that namespace.
func Grants(defaultSCC string) sccadmit.Grants {
	return func(scc string, ns *corev1.Namespace) bool {
		return scc == defaultSCC || ns.Labels[GrantLabelPrefix+scc] == "true"
	}
}
