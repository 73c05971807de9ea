package check

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WebhookName is the webhook's name in the chart's
// MutatingWebhookConfiguration (and config/webhook): how check finds the
// installation whatever the release is called.
const WebhookName = "inject.addon-heartbeat.io"

const (
	scopeWebhook = "webhook"
	// installFix is how to install or repair the chart's objects.
	installFix = "helm upgrade --install addon-heartbeat charts/addon-heartbeat -n addon-heartbeat-system --create-namespace"
	// componentLabel marks the webhook Deployment in the chart and in
	// config/manager.
	componentLabel = "app.kubernetes.io/component"
)

// install is what check learned about the webhook installation, for the
// checks of the workloads.
type install struct {
	config *admissionregistrationv1.MutatingWebhookConfiguration
	hook   *admissionregistrationv1.MutatingWebhook
	// deployment is the webhook's Deployment; nil when it was not found.
	deployment *appsv1.Deployment
	// args are the webhook container's flags, by name without dashes.
	args map[string]string
}

func (in *install) arg(name string) string {
	if in == nil {
		return ""
	}
	return in.args[name]
}

// reporterImage is the image the webhook injects now; empty when unknown.
func (in *install) reporterImage() string { return in.arg("reporter-image") }

// deploymentRef is "deployment/<name> -n <ns>" for fixes, or a generic phrase.
func (in *install) logsFix() string {
	if in == nil || in.deployment == nil {
		return "see the webhook's log"
	}
	return fmt.Sprintf("kubectl -n %s logs deployment/%s", in.deployment.Namespace, in.deployment.Name)
}

// checkWebhook checks the MutatingWebhookConfiguration, the webhook's
// Deployment, that it serves, that its caBundle verifies what it serves, its
// matchConditions and its failure policy. The returned install is nil when no
// configuration was found.
func (c *Checker) checkWebhook(ctx context.Context, r *Report) (*install, error) {
	var list admissionregistrationv1.MutatingWebhookConfigurationList
	if err := c.Client.List(ctx, &list); err != nil {
		return nil, cannot("listing MutatingWebhookConfigurations", err)
	}
	var found []*install
	for i := range list.Items {
		mwc := &list.Items[i]
		for j := range mwc.Webhooks {
			if mwc.Webhooks[j].Name == WebhookName {
				found = append(found, &install{config: mwc, hook: &mwc.Webhooks[j]})
			}
		}
	}
	switch len(found) {
	case 0:
		r.add(scopeWebhook, "configuration", StatusFail,
			fmt.Sprintf("no MutatingWebhookConfiguration has the webhook %s: opted-in Deployments are not injected", WebhookName), installFix)
		return nil, nil
	case 1:
		r.ok(scopeWebhook, "configuration", "MutatingWebhookConfiguration %s has the webhook %s", found[0].config.Name, WebhookName)
	default:
		names := make([]string, len(found))
		for i, f := range found {
			names[i] = f.config.Name
		}
		r.add(scopeWebhook, "configuration", StatusFail,
			fmt.Sprintf("%d MutatingWebhookConfigurations have the webhook %s (%s): two installations inject the same Deployments; checking %s",
				len(found), WebhookName, strings.Join(names, ", "), names[0]),
			"keep one installation: helm uninstall the other release, or kubectl delete mutatingwebhookconfiguration "+names[1])
	}
	in := found[0]
	if err := c.findDeployment(ctx, r, in); err != nil {
		return in, err
	}
	c.checkServing(ctx, r, in)
	c.checkMatchConditions(r, in)
	c.checkFailurePolicy(r, in)
	return in, nil
}

// findDeployment finds the webhook's Deployment: the one whose container
// names this configuration with --webhook-config-name, as the chart's does.
// Its --reporter-image is the image the webhook injects now.
func (c *Checker) findDeployment(ctx context.Context, r *Report, in *install) error {
	opts := []client.ListOption{client.HasLabels{componentLabel}}
	if svc := in.hook.ClientConfig.Service; svc != nil {
		opts = append(opts, client.InNamespace(svc.Namespace))
	}
	var deps appsv1.DeploymentList
	if err := c.Client.List(ctx, &deps, opts...); err != nil {
		return cannot("listing the webhook's Deployment", err)
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		for _, ctr := range d.Spec.Template.Spec.Containers {
			args := flagValues(ctr.Args)
			if args["webhook-config-name"] == in.config.Name {
				in.deployment, in.args = d, args
				break
			}
		}
		if in.deployment != nil {
			break
		}
	}
	if in.deployment == nil {
		r.add(scopeWebhook, "deployment", StatusFail,
			fmt.Sprintf("no Deployment labelled %s runs the webhook with --webhook-config-name=%s, so the reporter image it injects is unknown",
				componentLabel, in.config.Name), installFix)
		return nil
	}
	d := in.deployment
	if in.reporterImage() == "" {
		r.add(scopeWebhook, "deployment", StatusFail,
			fmt.Sprintf("Deployment %s/%s runs the webhook without --reporter-image", d.Namespace, d.Name), installFix)
		return nil
	}
	r.ok(scopeWebhook, "deployment", "Deployment %s/%s injects reporter image %s", d.Namespace, d.Name, in.reporterImage())
	return nil
}

// flagValues reads --name=value and --name value arguments.
func flagValues(args []string) map[string]string {
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			value = args[i+1]
			i++
		}
		out[name] = value
	}
	return out
}

// checkServing checks that the webhook answers TLS where the API server
// sends reviews, and that the caBundle verifies the certificate it serves.
func (c *Checker) checkServing(ctx context.Context, r *Report, in *install) {
	cc := in.hook.ClientConfig
	switch {
	case cc.Service != nil:
		c.checkService(ctx, r, in)
	case cc.URL != nil:
		c.checkURL(ctx, r, in)
	default:
		r.add(scopeWebhook, "serving", StatusFail, "the webhook's clientConfig has neither a service nor a url", installFix)
		r.add(scopeWebhook, "trusted", StatusSkip, "nothing to connect to", "")
	}
}

func (c *Checker) checkURL(ctx context.Context, r *Report, in *install) {
	raw := *in.hook.ClientConfig.URL
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		r.add(scopeWebhook, "serving", StatusFail, fmt.Sprintf("clientConfig.url %q is not a URL", raw), installFix)
		r.add(scopeWebhook, "trusted", StatusSkip, "nothing to connect to", "")
		return
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	dial := c.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	var chain []*x509.Certificate
	conn, err := dial(ctx, "tcp", addr)
	if err == nil {
		chain, err = servedChain(ctx, conn, u.Hostname())
	}
	if err != nil {
		r.add(scopeWebhook, "serving", StatusFail, fmt.Sprintf("%s: %v", raw, err), startFix(in))
		r.add(scopeWebhook, "trusted", StatusSkip, "the webhook does not answer", "")
		return
	}
	r.ok(scopeWebhook, "serving", "%s answers TLS", raw)
	c.checkTrust(r, in, chain, u.Hostname(), raw)
}

// startFix is how to get webhook pods running again.
func startFix(in *install) string {
	if in.deployment == nil {
		return "start the webhook: " + installFix
	}
	d := in.deployment
	return fmt.Sprintf("kubectl -n %s rollout status deployment/%s, and %s", d.Namespace, d.Name, in.logsFix())
}

func (c *Checker) checkService(ctx context.Context, r *Report, in *install) {
	ref := in.hook.ClientConfig.Service
	port := int32(443)
	if ref.Port != nil {
		port = *ref.Port
	}
	name := ref.Namespace + "/" + ref.Name
	var svc corev1.Service
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &svc); err != nil {
		status := StatusFail
		if !apierrors.IsNotFound(err) {
			status = StatusWarn
		}
		r.add(scopeWebhook, "serving", status, fmt.Sprintf("Service %s: %v", name, err), installFix)
		r.add(scopeWebhook, "trusted", StatusSkip, "no Service to connect to", "")
		return
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port })
	if i < 0 {
		r.add(scopeWebhook, "serving", StatusFail, fmt.Sprintf("Service %s has no port %d, the port the webhook configuration names", name, port), installFix)
		r.add(scopeWebhook, "trusted", StatusSkip, "no Service port to connect to", "")
		return
	}
	portName := svc.Spec.Ports[i].Name
	var endpoints discoveryv1.EndpointSliceList
	if err := c.Client.List(ctx, &endpoints, client.InNamespace(ref.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: ref.Name}); err != nil {
		r.add(scopeWebhook, "serving", StatusWarn, fmt.Sprintf("listing the endpoints of Service %s: %v", name, err),
			"run check as a user who may list endpointslices.discovery.k8s.io")
		r.add(scopeWebhook, "trusted", StatusSkip, "the webhook's endpoints are unknown", "")
		return
	}
	ready, notReady := readyEndpoints(endpoints.Items, portName)
	if len(ready) == 0 {
		r.add(scopeWebhook, "serving", StatusFail,
			fmt.Sprintf("Service %s has no ready endpoint (%d not ready): no webhook pod is ready to answer the API server", name, notReady),
			startFix(in))
		r.add(scopeWebhook, "trusted", StatusSkip, "no webhook pod is ready", "")
		return
	}
	pods := make([]string, len(ready))
	for i, e := range ready {
		pods[i] = e.pod
	}
	r.ok(scopeWebhook, "serving", "Service %s: %d of %d endpoints ready (%s)", name, len(ready), len(ready)+notReady, strings.Join(pods, ", "))
	serverName := ref.Name + "." + ref.Namespace + ".svc"
	if c.Pods == nil {
		r.add(scopeWebhook, "trusted", StatusSkip, "not connecting to the webhook pods", "")
		return
	}
	e := ready[0]
	var chain []*x509.Certificate
	conn, err := c.Pods.DialPod(ctx, ref.Namespace, e.pod, e.port)
	if err == nil {
		chain, err = servedChain(ctx, conn, serverName)
	}
	if err != nil {
		r.add(scopeWebhook, "trusted", StatusWarn,
			fmt.Sprintf("could not read the certificate pod %s serves on port %d: %v", e.pod, e.port, err),
			fmt.Sprintf("check reads it through a port-forward, which must work as for kubectl -n %s port-forward pod/%s %d (it needs create on pods/portforward there)",
				ref.Namespace, e.pod, e.port))
		return
	}
	c.checkTrust(r, in, chain, serverName, "pod "+ref.Namespace+"/"+e.pod)
}

// endpoint is a ready webhook pod and the port it serves on.
type endpoint struct {
	pod  string
	port int
}

// readyEndpoints are the ready pod endpoints of the Service port named
// portName, and how many are not ready.
func readyEndpoints(eps []discoveryv1.EndpointSlice, portName string) (ready []endpoint, notReady int) {
	for _, s := range eps {
		j := slices.IndexFunc(s.Ports, func(p discoveryv1.EndpointPort) bool {
			return p.Port != nil && (p.Name == nil && portName == "" || p.Name != nil && *p.Name == portName)
		})
		if j < 0 {
			continue
		}
		port := int(*s.Ports[j].Port)
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				notReady++
				continue
			}
			pod := ""
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				pod = e.TargetRef.Name
			}
			if pod == "" && len(e.Addresses) > 0 {
				pod = e.Addresses[0]
			}
			ready = append(ready, endpoint{pod: pod, port: port})
		}
	}
	slices.SortFunc(ready, func(a, b endpoint) int { return strings.Compare(a.pod, b.pod) })
	return ready, notReady
}

// checkTrust verifies the served chain against the caBundle for the name
// the API server connects to.
func (c *Checker) checkTrust(r *Report, in *install, chain []*x509.Certificate, name, where string) {
	now := c.now()
	if err := verifyServed(chain, in.hook.ClientConfig.CABundle, name, now); err != nil {
		r.add(scopeWebhook, "trusted", StatusFail, fmt.Sprintf("%s: %v: the API server refuses to call the webhook", where, err), caBundleFix(in))
		return
	}
	leaf := chain[0]
	r.ok(scopeWebhook, "trusted", "the caBundle verifies the certificate %s serves for %s (issuer %q, valid until %s)",
		where, name, leaf.Issuer.CommonName, leaf.NotAfter.UTC().Format("2006-01-02"))
}

// caBundleFix says who sets the caBundle in the installation's certificate
// mode, and so where to look when it is wrong.
func caBundleFix(in *install) string {
	ns := ""
	if in.deployment != nil {
		ns = in.deployment.Namespace
	} else if in.hook.ClientConfig.Service != nil {
		ns = in.hook.ClientConfig.Service.Namespace
	}
	switch a := in.config.Annotations; {
	case a["cert-manager.io/inject-ca-from"] != "":
		return fmt.Sprintf("cert-manager's CA injector sets the caBundle from Certificate %s: check that it is Ready (kubectl get certificate -n %s) and that cert-manager's cainjector runs",
			a["cert-manager.io/inject-ca-from"], strings.Split(a["cert-manager.io/inject-ca-from"], "/")[0])
	case a["service.beta.openshift.io/inject-cabundle"] == "true":
		return "OpenShift's service CA operator sets the caBundle: check its pods (oc -n openshift-service-ca get pods)"
	case in.arg("cert-mode") == "self-managed":
		return fmt.Sprintf("the webhook's elected replica rewrites the caBundle from Secret %s/%s within seconds; if it stays wrong, see which replica leads and its log: kubectl -n %s get lease %s, and %s",
			ns, in.arg("cert-secret-name"), ns, in.arg("leader-election-id"), in.logsFix())
	default:
		return "set clientConfig.caBundle to the CA that issued the webhook's serving certificate"
	}
}

func (c *Checker) checkMatchConditions(r *Report, in *install) {
	conds := in.hook.MatchConditions
	if len(conds) == 0 {
		r.add(scopeWebhook, "matchConditions", StatusFail,
			"none: the API server calls the webhook for every Deployment of the served namespaces, so all of them wait on it (and fail while it is down, with failurePolicy Fail)",
			"install the chart's configuration, which only sends opted-in Deployments (Kubernetes 1.30+): "+installFix)
		return
	}
	names := make([]string, len(conds))
	for i, mc := range conds {
		names[i] = mc.Name
	}
	r.ok(scopeWebhook, "matchConditions", "%s: only opted-in Deployments are sent to the webhook", strings.Join(names, ", "))
}

func (c *Checker) checkFailurePolicy(r *Report, in *install) {
	policy := admissionregistrationv1.Fail // the API's default
	if in.hook.FailurePolicy != nil {
		policy = *in.hook.FailurePolicy
	}
	switch policy {
	case admissionregistrationv1.Fail:
		r.ok(scopeWebhook, "failurePolicy", "Fail: while the webhook is down, opted-in Deployments are refused, never admitted without their reporter")
	case admissionregistrationv1.Ignore:
		r.add(scopeWebhook, "failurePolicy", StatusWarn,
			"Ignore: while the webhook is down, opted-in Deployments are admitted without their reporter, and stop heartbeating at their next rollout",
			"set the chart value webhook.failurePolicy=Fail, unless admitting Deployments matters more than their heartbeat")
	default:
		r.add(scopeWebhook, "failurePolicy", StatusFail, fmt.Sprintf("%q is not a failure policy the API server knows", policy), "set the chart value webhook.failurePolicy=Fail")
	}
}

// namespaceServed reports whether the webhook's namespaceSelector selects
// namespace ns (the API server then sends its Deployments).
func (c *Checker) namespaceServed(ctx context.Context, in *install, ns string) (bool, error) {
	if in.hook.NamespaceSelector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(in.hook.NamespaceSelector)
	if err != nil {
		return false, fmt.Errorf("the webhook's namespaceSelector: %w", err)
	}
	var n corev1.Namespace
	if err := c.Client.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
		return false, err
	}
	return sel.Matches(labels.Set(n.Labels)), nil
}
