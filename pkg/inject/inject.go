// Package inject is the pure, deterministic mutation of an apps/v1 Deployment
// that adds (or removes) the heartbeat reporter. It does no I/O: the webhook
// wraps it, and tests drive it directly.
//
// Mutate returns the mutated Deployment and the JSON patch that produces it
// from the request, touching only the paths the injector owns: the reporter
// container, ADDON_TARGET_NAMESPACE entries it adds to addon containers, and
// the addon-heartbeat.io/status annotation. Patching only those paths, rather
// than diffing whole objects, keeps fields this package's API types do not
// know (newer Kubernetes versions) exactly as the user sent them.
package inject

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// Action says what Mutate did to a Deployment.
type Action string

// The actions, also the outcomes the webhook counts.
const (
	// Injected: the reporter was added or brought up to date.
	Injected Action = "injected"
	// Unchanged: the Deployment already was as it should be, or is not opted in.
	Unchanged Action = "unchanged"
	// Removed: the Deployment opted out and everything injected was removed.
	Removed Action = "removed"
)

// Result is the outcome of Mutate.
type Result struct {
	// Deployment is the mutated copy; the input is never modified.
	Deployment *appsv1.Deployment
	// Patch turns the input into Deployment; empty when Action is Unchanged.
	Patch Patch
	// Action says what was done.
	Action Action
	// Warnings are for the admission response: the Deployment is admitted
	// as Patch makes it, but something will not work as its owner expects.
	Warnings []string
}

// Where the reporter goes: the names of the pod spec's container lists, as
// they appear in JSON and in the status record.
const (
	listInit    = "initContainers"
	listRegular = "containers"
)

const podSpecPath = "/spec/template/spec"

// Mutate injects the reporter into a Deployment that opts in, brings an
// injected one up to date, and removes what was injected from one that opts
// out. The same input always gives byte-identical output, and Mutate of its
// own output is Unchanged.
//
// Errors name what is wrong and what is expected: an invalid annotation is an
// *annotations.Error; a container already named like the reporter (and not
// injected by us) is refused.
func Mutate(in *appsv1.Deployment, cfg Config) (Result, error) {
	return mutate(in, cfg, in.DeepCopy)
}

// MutateInPlace is Mutate for a caller that owns in and needs it no more as
// it was, such as an admission handler with the object it just decoded: in
// itself becomes the result's Deployment, which saves copying the whole
// Deployment (a twentieth of an admission's CPU for an 8 KB object). After
// an error in may be partly changed.
func MutateInPlace(in *appsv1.Deployment, cfg Config) (Result, error) {
	return mutate(in, cfg, func() *appsv1.Deployment { return in })
}

// mutate is Mutate, changing the Deployment that working returns (a copy of
// in, or in itself).
func mutate(in *appsv1.Deployment, cfg Config, working func() *appsv1.Deployment) (Result, error) {
	settings, err := annotations.Parse(annotations.OfDeployment(in))
	if err != nil {
		return Result{}, err
	}
	prev, err := ReadRecord(in.Annotations)
	if err != nil {
		return Result{}, err
	}
	if !settings.Inject && prev == nil {
		return Result{Deployment: in, Action: Unchanged}, nil
	}
	var warnings []string
	if settings.Inject {
		if w := instanceWarning(settings.AddonInstance, cfg.AddonInstanceNames); w != "" {
			warnings = []string{w}
		}
	}
	m := &mutation{d: working()}
	action := Removed
	if settings.Inject {
		if err := m.inject(settings, cfg, prev); err != nil {
			return Result{}, err
		}
		action = Injected
	} else {
		m.remove(prev)
	}
	if len(m.patch) == 0 {
		return Result{Deployment: in, Action: Unchanged, Warnings: warnings}, nil
	}
	return Result{Deployment: m.d, Patch: m.patch, Action: action, Warnings: warnings}, nil
}

// maxWarning is the length the API server keeps of an admission warning.
const maxWarning = 256

// instanceWarning is the admission warning for a reporter of instance when
// the reporter role allows only names (none when names is empty or holds
// it): the webhook injects it anyway, since the addon itself works and only
// its heartbeats would be forbidden, but says so at admission rather than
// leave it to a log line in every addon pod.
func instanceWarning(instance string, names []string) string {
	if len(names) == 0 || slices.Contains(names, instance) {
		return ""
	}
	allowed := strings.Join(names, ", ")
	w := func(allowed string) string {
		return fmt.Sprintf("%s=%q: the reporter role allows only the AddonInstances %s, so this reporter's heartbeats will be forbidden; "+
			"add the name to the chart's reporter.addonInstanceNames", annotations.AddonInstance, instance, allowed)
	}
	if len(w(allowed)) > maxWarning {
		allowed = fmt.Sprintf("%s and %d more", names[0], len(names)-1)
	}
	return w(allowed)
}

// mutation changes a Deployment copy and records, in the same order, the
// JSON patch operations that make the same change to the request.
type mutation struct {
	d     *appsv1.Deployment
	patch Patch
}

func (m *mutation) spec() *corev1.PodSpec { return &m.d.Spec.Template.Spec }

func (m *mutation) list(name string) *[]corev1.Container {
	if name == listInit {
		return &m.spec().InitContainers
	}
	return &m.spec().Containers
}

// find returns the list and index of the container called name.
func (m *mutation) find(name string) (string, int) {
	for _, l := range []string{listInit, listRegular} {
		if i := slices.IndexFunc(*m.list(l), func(c corev1.Container) bool { return c.Name == name }); i >= 0 {
			return l, i
		}
	}
	return "", -1
}

func (m *mutation) inject(s annotations.Settings, cfg Config, prev *Record) error {
	if err := portClash(m.spec(), cfg); err != nil {
		return err
	}
	want := reporterContainer(s, cfg, m.spec().HostNetwork)
	wantList := listRegular
	if cfg.NativeSidecar {
		wantList = listInit
	}
	have, at := m.find(ContainerName)
	if have != "" && prev == nil {
		return fmt.Errorf("container name %q is reserved for the injected heartbeat reporter: rename that container, or remove annotation %s", ContainerName, annotations.Inject)
	}

	// Environment first, while every index is still the request's.
	var recorded []string
	if prev != nil {
		recorded = prev.Env
	}
	var envd []string
	for _, l := range []string{listInit, listRegular} {
		for i := range *m.list(l) {
			c := &(*m.list(l))[i]
			if c.Name == ContainerName {
				continue
			}
			if j := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == TargetNamespaceEnv }); j >= 0 {
				if slices.Contains(recorded, c.Name) && isInjectedTargetEnv(c.Env[j]) {
					envd = append(envd, c.Name)
				}
				continue
			}
			if envFromMaySet(c.EnvFrom, TargetNamespaceEnv) {
				continue
			}
			m.addEnv(l, i, targetNamespaceEnv())
			envd = append(envd, c.Name)
		}
	}

	switch {
	case have == wantList:
		if !equality.Semantic.DeepEqual((*m.list(have))[at], want) {
			(*m.list(have))[at] = want
			m.patch.replace(pointer("spec", "template", "spec", have, index(at)), want)
		}
	case have != "":
		m.removeContainer(have, at)
		m.appendContainer(wantList, want)
	default:
		m.appendContainer(wantList, want)
	}

	sa := serviceAccount(&m.d.Spec.Template.Spec)
	m.setStatus(Record{Version: RecordVersion, Sidecar: wantList, Env: envd, ServiceAccount: sa, AddonInstance: s.AddonInstance,
		Signature: Sign(cfg.RecordKey, m.d.Namespace, sa, s.AddonInstance)}.encode())
	return nil
}

func (m *mutation) remove(prev *Record) {
	for _, l := range []string{listInit, listRegular} {
		for i := range *m.list(l) {
			c := &(*m.list(l))[i]
			if !slices.Contains(prev.Env, c.Name) {
				continue
			}
			if j := slices.IndexFunc(c.Env, isInjectedTargetEnv); j >= 0 {
				m.removeEnv(l, i, j)
			}
		}
	}
	if l, i := m.find(ContainerName); l != "" {
		m.removeContainer(l, i)
	}
	delete(m.d.Annotations, annotations.Status)
	m.patch.remove(pointer("metadata", "annotations", annotations.Status))
}

// envFromMaySet tells whether an envFrom source could define name: any
// ConfigMap or Secret imported with a prefix that name starts with. Such a
// container is left alone, since an explicit env entry would override the
// value the user provides there.
func envFromMaySet(sources []corev1.EnvFromSource, name string) bool {
	return slices.ContainsFunc(sources, func(s corev1.EnvFromSource) bool { return strings.HasPrefix(name, s.Prefix) })
}

func (m *mutation) addEnv(list string, i int, e corev1.EnvVar) {
	c := &(*m.list(list))[i]
	if len(c.Env) == 0 {
		m.patch.add(pointer("spec", "template", "spec", list, index(i), "env"), []corev1.EnvVar{e})
	} else {
		m.patch.add(pointer("spec", "template", "spec", list, index(i), "env", "-"), e)
	}
	c.Env = append(c.Env, e)
}

func (m *mutation) removeEnv(list string, i, j int) {
	c := &(*m.list(list))[i]
	if len(c.Env) == 1 {
		// Drop the field we created rather than leave an empty list behind.
		m.patch.remove(pointer("spec", "template", "spec", list, index(i), "env"))
		c.Env = nil
		return
	}
	m.patch.remove(pointer("spec", "template", "spec", list, index(i), "env", index(j)))
	c.Env = slices.Delete(c.Env, j, j+1)
}

func (m *mutation) appendContainer(list string, c corev1.Container) {
	l := m.list(list)
	if len(*l) == 0 {
		m.patch.add(podSpecPath+"/"+list, []corev1.Container{c})
	} else {
		m.patch.add(podSpecPath+"/"+list+"/-", c)
	}
	*l = append(*l, c)
}

func (m *mutation) removeContainer(list string, i int) {
	l := m.list(list)
	if len(*l) == 1 {
		m.patch.remove(podSpecPath + "/" + list)
		*l = nil
		return
	}
	m.patch.remove(podSpecPath + "/" + list + "/" + index(i))
	*l = slices.Delete(*l, i, i+1)
}

func (m *mutation) setStatus(v string) {
	if cur, ok := m.d.Annotations[annotations.Status]; ok && cur == v {
		return
	}
	if m.d.Annotations == nil {
		// A Deployment that opts in by label or pod-template annotation,
		// as OLM builds them, may have no annotations at all.
		m.d.Annotations = map[string]string{}
		m.patch.add("/metadata/annotations", map[string]string{})
	}
	m.d.Annotations[annotations.Status] = v
	m.patch.add(pointer("metadata", "annotations", annotations.Status), v)
}
