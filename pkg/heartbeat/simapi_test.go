//go:build go1.25

package heartbeat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// simServer is the simulation's API server: an http.RoundTripper per process
// (simTransport) in front of one in-memory store, inside the synctest bubble
// of one schedule, so that its time is the bubble's (server time) and every
// wait in it is durably blocking. It serves exactly what the Reporter uses
// without DeploymentHealth (see kube.go):
//
//   - coordination.k8s.io/v1 leases: GET, PUT (resourceVersion preconditions:
//     409 Conflict), POST (409 AlreadyExists), and a watch with a field
//     selector on metadata.name, from a resourceVersion (the events since,
//     or 410 Expired below the compaction point) or from none (a synthetic
//     ADDED);
//   - addons.managed.openshift.io/v1alpha1 addoninstances: GET, list, watch
//     (the informer's, with the watch-list protocol: initial ADDED events and
//     the k8s.io/initial-events-end bookmark), and PUT of the status
//     subresource against the resourceVersion (spec and metadata kept, 409 on
//     a stale version);
//   - 404 for anything else (counted: the Reporter should send none).
//
// Requests arrive in whatever encoding client-go sends (protobuf for Leases)
// and are decoded with a CodecFactory's UniversalDeserializer; every answer
// is JSON, with a Date header (the serverClock reads it). Watches stream
// newline-framed JSON WatchEvents through a channel-backed body.
//
// Faults are applied on the way (simTransport.RoundTrip): a delay before the
// server applies a request and another before its answer returns, failures
// (503 or a refused connection before applying, a reset connection after),
// partitions of one process, and the fates of requests whose client gave up
// while they were on their way (applied anyway, or not). The draws for a
// request come from a source of its own process and request kind (simRand),
// so that they depend only on the seed and on the order of that process's
// requests of that kind.
type simServer struct {
	ns, name, leaseName string
	start               time.Time
	codecs              serializer.CodecFactory
	decoder             runtime.Decoder

	mu sync.Mutex // guards everything below
	rv int64
	// rvAt is the resourceVersion at each change, for compaction.
	rvAt []simRVTime
	// compacted: a watch from below this version gets 410 Expired.
	compacted int64
	lease     *coordinationv1.Lease
	ai        *addonsv1alpha1.AddonInstance
	// history of each resource's events, for watches from a version.
	leaseHist, aiHist []simEvent
	streams           map[*simStream]struct{}
	storm             simStorm
	partitions        map[*simProc]simPartition
	// ended is set at teardown: streams opened after it end at once.
	ended bool
	// blackholed is when the last blackholed request of each process
	// returned: a partition's effect lasts until then.
	blackholed map[*simProc]time.Time
	// stormTails is, per storm (by its end), when the last request that
	// arrived during it returned: its delays outlast it.
	stormTails map[time.Time]time.Time

	// The server's own record, for the invariants (see sim_test.go).
	hbs    []simHB
	leases []simLeaseWrite
	log    []simLogEntry
	stats  simStats
	// protocol holds violations of the AddonInstance protocol by a status
	// write (Healthy or the spec changed).
	protocol []string
	// operatorCopies are the versions of the AddonInstance the operator's
	// stale cache may hold (see simOperator).
	aiVersions []simVersion
}

type simRVTime struct {
	at time.Time
	rv int64
}

type simVersion struct {
	at time.Time
	ai *addonsv1alpha1.AddonInstance
}

// simEvent is one watch event, encoded once for every stream.
type simEvent struct {
	rv    int64
	frame []byte
}

// simStorm is the weather: while it lasts requests fail with probability
// failRate and are delayed by up to half a period (and some by up to two).
type simStorm struct {
	until    time.Time
	failRate float64
}

// simPartition cuts one process off the API server until a time: its
// requests are refused at once, or (blackhole) hang until their client
// gives up or an HTTP/2 ping timeout (45s) ends the connection.
type simPartition struct {
	until     time.Time
	blackhole bool
}

// simHB is one status write applied by the server.
type simHB struct {
	at       time.Time
	proc     *simProc // nil: the operator
	old, new time.Time
	rv       int64
	period   time.Duration // the spec's, when applied
	ghost    bool          // its client had given up before it was applied
	sentAt   time.Time
	moved    bool
}

// simLeaseWrite is one change of the Lease applied by the server.
type simLeaseWrite struct {
	at      time.Time
	proc    *simProc // nil: the simulation (a deletion, a stale holder)
	op      string   // create, update, delete
	holder  string
	process string
	period  time.Duration // announced (election.PeriodAnnotation), 0 when none
	rv      int64
}

type simLogEntry struct {
	at   time.Duration
	what string
}

// simStats counts what the server did and the faults it injected.
type simStats struct {
	requests   int
	byProc     map[*simProc]int
	faults     map[string]int
	unexpected int
}

func (s *simStats) fault(kind string) {
	if s.faults == nil {
		s.faults = map[string]int{}
	}
	s.faults[kind]++
}

const simInitialEventsEnd = "k8s.io/initial-events-end"

func newSimServer(ns, name string, period time.Duration) *simServer {
	scheme := runtime.NewScheme()
	utilruntime.Must(addonsv1alpha1.AddToScheme(scheme))
	utilruntime.Must(coordinationv1.AddToScheme(scheme))
	codecs := serializer.NewCodecFactory(scheme)
	s := &simServer{
		ns: ns, name: name, leaseName: election.LeaseName(name),
		start: time.Now(), codecs: codecs, decoder: codecs.UniversalDeserializer(),
		streams: map[*simStream]struct{}{}, partitions: map[*simProc]simPartition{},
		blackholed: map[*simProc]time.Time{}, stormTails: map[time.Time]time.Time{},
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ai := &addonsv1alpha1.AddonInstance{
		TypeMeta: metav1.TypeMeta{APIVersion: addonsv1alpha1.GroupVersion.String(), Kind: "AddonInstance"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "sim-addon-instance", Generation: 1,
			CreationTimestamp: metav1.NewTime(time.Now())},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}},
	}
	s.putAI(ai, "created")
	return s
}

// logf records an event in the server's log at the current server time.
// The caller holds mu.
func (s *simServer) logf(format string, args ...any) {
	s.log = append(s.log, simLogEntry{at: time.Since(s.start), what: fmt.Sprintf(format, args...)})
}

func (s *simServer) Logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.logf(format, args...)
}

func (s *simServer) nextRV() int64 {
	s.rv++
	s.rvAt = append(s.rvAt, simRVTime{at: time.Now(), rv: s.rv})
	return s.rv
}

// period is the AddonInstance's period, as heartbeats follow it.
func (s *simServer) period() time.Duration {
	return instancePeriod(s.ai)
}

// putAI stores a new version of the AddonInstance and sends it to watches.
func (s *simServer) putAI(ai *addonsv1alpha1.AddonInstance, why string) {
	ai.ResourceVersion = strconv.FormatInt(s.nextRV(), 10)
	s.ai = ai
	s.aiVersions = append(s.aiVersions, simVersion{at: time.Now(), ai: ai.DeepCopy()})
	typ := watch.Modified
	if why == "created" {
		typ = watch.Added
	}
	s.emit(&s.aiHist, "addoninstances", ai.Name, typ, ai)
}

// putLease stores a Lease (nil: deleted) and sends the change to watches.
func (s *simServer) putLease(l *coordinationv1.Lease, proc *simProc, op string) {
	rv := s.nextRV()
	w := simLeaseWrite{at: time.Now(), proc: proc, op: op, rv: rv}
	if l != nil {
		l.TypeMeta = metav1.TypeMeta{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease"}
		l.ResourceVersion = strconv.FormatInt(rv, 10)
		w.holder = ptr.Deref(l.Spec.HolderIdentity, "")
		w.process = l.Annotations[election.ProcessAnnotation]
		w.period, _ = time.ParseDuration(l.Annotations[election.PeriodAnnotation])
		s.emit(&s.leaseHist, "leases", l.Name, map[string]watch.EventType{"create": watch.Added}[op], l)
	} else {
		old := s.lease.DeepCopy()
		old.ResourceVersion = strconv.FormatInt(rv, 10)
		s.emit(&s.leaseHist, "leases", old.Name, watch.Deleted, old)
	}
	s.lease = l
	s.leases = append(s.leases, w)
}

// emit records an event and queues it on every open stream of resource.
func (s *simServer) emit(hist *[]simEvent, resource, name string, typ watch.EventType, obj runtime.Object) {
	if typ == "" {
		typ = watch.Modified
	}
	rv, _ := strconv.ParseInt(objRV(obj), 10, 64)
	ev := simEvent{rv: rv, frame: simFrame(typ, obj)}
	*hist = append(*hist, ev)
	for st := range s.streams {
		if st.resource == resource && st.name == name {
			st.push(ev)
		}
	}
}

func objRV(obj runtime.Object) string {
	switch o := obj.(type) {
	case *coordinationv1.Lease:
		return o.ResourceVersion
	case *addonsv1alpha1.AddonInstance:
		return o.ResourceVersion
	}
	return ""
}

// simFrame encodes one watch event as client-go's JSON framing reads it.
func simFrame(typ watch.EventType, obj any) []byte {
	raw, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	b, err := json.Marshal(metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: raw}})
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

func simStatus(err *apierrors.StatusError) (int, []byte) {
	st := err.ErrStatus
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	b, _ := json.Marshal(st)
	return int(st.Code), b
}

var (
	leaseGR = schema.GroupResource{Group: coordinationv1.GroupName, Resource: "leases"}
	aiGR    = schema.GroupResource{Group: addonsv1alpha1.GroupVersion.Group, Resource: "addoninstances"}
)

// simRequest is one request as the server sees it.
type simRequest struct {
	proc   *simProc
	method string
	kind   string // lease-get, lease-put, lease-post, lease-watch, ai-get, ai-list, ai-watch, ai-put, other
	name   string
	query  url.Values
	body   []byte
	sentAt time.Time
	ghost  bool
}

// classify names a request's kind from its method and path.
func (s *simServer) classify(req *http.Request) (kind, name string) {
	leases := "/apis/coordination.k8s.io/v1/namespaces/" + s.ns + "/leases"
	ais := "/apis/" + addonsv1alpha1.GroupVersion.String() + "/namespaces/" + s.ns + "/addoninstances"
	p := req.URL.Path
	watching := req.URL.Query().Get("watch") == "true"
	switch {
	case p == "/version" && req.Method == http.MethodGet:
		return "version-get", ""
	case p == leases && req.Method == http.MethodGet && watching:
		return "lease-watch", ""
	case p == leases && req.Method == http.MethodPost:
		return "lease-post", ""
	case strings.HasPrefix(p, leases+"/") && !strings.Contains(p[len(leases)+1:], "/"):
		name = p[len(leases)+1:]
		switch req.Method {
		case http.MethodGet:
			return "lease-get", name
		case http.MethodPut:
			return "lease-put", name
		}
	case p == ais && req.Method == http.MethodGet && watching:
		return "ai-watch", ""
	case p == ais && req.Method == http.MethodGet:
		return "ai-list", ""
	case strings.HasPrefix(p, ais+"/"):
		rest := strings.Split(p[len(ais)+1:], "/")
		switch {
		case len(rest) == 1 && req.Method == http.MethodGet:
			return "ai-get", rest[0]
		case len(rest) == 2 && rest[1] == "status" && req.Method == http.MethodPut:
			return "ai-put", rest[0]
		}
	}
	return "other", ""
}

// simResponse is what applying a request produced: a status and body, or a
// stream.
type simResponse struct {
	code   int
	body   []byte
	stream *simStream
}

// apply performs a request on the store. It is called once per request
// that reaches the server, at the moment the server applies it.
func (s *simServer) apply(r *simRequest) simResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.requests++
	if s.stats.byProc == nil {
		s.stats.byProc = map[*simProc]int{}
	}
	s.stats.byProc[r.proc]++
	resp := s.applyLocked(r)
	what := fmt.Sprintf("%s %s %s -> %d", r.proc, r.kind, r.name, resp.code)
	if r.ghost {
		what += " (its client had given up)"
	}
	if resp.stream != nil {
		what += " stream from rv " + r.query.Get("resourceVersion")
	}
	if (r.kind == "lease-put" || r.kind == "lease-post") && resp.code < 300 && s.lease != nil {
		what += fmt.Sprintf(" (holder %q, period %s, rv %s)", ptr.Deref(s.lease.Spec.HolderIdentity, ""),
			s.lease.Annotations[election.PeriodAnnotation], s.lease.ResourceVersion)
	}
	if r.kind == "ai-put" && resp.code < 300 {
		what += fmt.Sprintf(" (lastHeartbeatTime %s, rv %s)", s.ai.Status.LastHeartbeatTime.UTC().Format(time.TimeOnly), s.ai.ResourceVersion)
	}
	s.logf("%s", what)
	return resp
}

func (s *simServer) applyLocked(r *simRequest) simResponse {
	json200 := func(obj any) simResponse {
		b, err := json.Marshal(obj)
		if err != nil {
			panic(err)
		}
		return simResponse{code: http.StatusOK, body: b}
	}
	fail := func(err *apierrors.StatusError) simResponse {
		code, b := simStatus(err)
		return simResponse{code: code, body: b}
	}
	switch r.kind {
	case "version-get":
		return json200(map[string]string{"major": "1", "minor": "37", "gitVersion": "v1.37.2"})
	case "lease-get":
		if s.lease == nil || r.name != s.leaseName {
			return fail(apierrors.NewNotFound(leaseGR, r.name))
		}
		return json200(s.leaseOut())
	case "lease-post", "lease-put":
		obj, _, err := s.decoder.Decode(r.body, nil, nil)
		in, ok := obj.(*coordinationv1.Lease)
		if err != nil || !ok {
			return fail(apierrors.NewBadRequest(fmt.Sprintf("decoding the Lease: %v", err)))
		}
		if in.Name != s.leaseName || (r.kind == "lease-put" && r.name != in.Name) {
			return fail(apierrors.NewBadRequest("the sim serves one Lease, " + s.leaseName))
		}
		if r.kind == "lease-post" {
			if s.lease != nil {
				return fail(apierrors.NewAlreadyExists(leaseGR, in.Name))
			}
			in.UID = types.UID(fmt.Sprintf("lease-%d", s.rv+1))
			in.CreationTimestamp = metav1.NewTime(time.Now())
			in.ResourceVersion = ""
			s.putLease(in, r.proc, "create")
			return simResponse{code: http.StatusCreated, body: mustJSON(s.leaseOut())}
		}
		if s.lease == nil {
			return fail(apierrors.NewNotFound(leaseGR, in.Name))
		}
		if in.ResourceVersion != "" && in.ResourceVersion != s.lease.ResourceVersion {
			return fail(apierrors.NewConflict(leaseGR, in.Name, errors.New("the object has been modified; please apply your changes to the latest version and try again")))
		}
		in.UID, in.CreationTimestamp = s.lease.UID, s.lease.CreationTimestamp
		s.putLease(in, r.proc, "update")
		return json200(s.leaseOut())
	case "lease-watch", "ai-watch":
		return s.openStream(r)
	case "ai-get":
		if s.ai == nil || r.name != s.name {
			return fail(apierrors.NewNotFound(aiGR, r.name))
		}
		return json200(s.ai)
	case "ai-list":
		list := &addonsv1alpha1.AddonInstanceList{
			TypeMeta: metav1.TypeMeta{APIVersion: addonsv1alpha1.GroupVersion.String(), Kind: "AddonInstanceList"},
			ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatInt(s.rv, 10)},
		}
		if s.ai != nil && s.selects(r.query) {
			list.Items = append(list.Items, *s.ai)
		}
		return json200(list)
	case "ai-put":
		obj, _, err := s.decoder.Decode(r.body, nil, nil)
		in, ok := obj.(*addonsv1alpha1.AddonInstance)
		if err != nil || !ok {
			return fail(apierrors.NewBadRequest(fmt.Sprintf("decoding the AddonInstance: %v", err)))
		}
		if s.ai == nil || in.Name != s.name {
			return fail(apierrors.NewNotFound(aiGR, in.Name))
		}
		if in.ResourceVersion != s.ai.ResourceVersion {
			return fail(apierrors.NewConflict(aiGR, in.Name, errors.New("the object has been modified; please apply your changes to the latest version and try again")))
		}
		s.writeStatus(in, r.proc, r.sentAt, r.ghost, r.query.Get("fieldManager"))
		return json200(s.ai)
	}
	s.stats.unexpected++
	return fail(apierrors.NewNotFound(schema.GroupResource{Resource: "unknown"}, r.name))
}

func mustJSON(obj any) []byte {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	return b
}

func (s *simServer) leaseOut() *coordinationv1.Lease {
	l := s.lease.DeepCopy()
	l.TypeMeta = metav1.TypeMeta{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease"}
	return l
}

// selects reports whether a request's field selector (metadata.name=...)
// selects the AddonInstance.
func (s *simServer) selects(q url.Values) bool {
	fs := q.Get("fieldSelector")
	return fs == "" || fs == "metadata.name="+s.name
}

// writeStatus applies a status write (by proc; nil: the operator) that
// passed its precondition, and checks the protocol: a reporter's write
// changes neither the spec nor Healthy.
func (s *simServer) writeStatus(in *addonsv1alpha1.AddonInstance, proc *simProc, sentAt time.Time, ghost bool, manager string) {
	cur := s.ai
	if proc != nil {
		if !apiequality.Semantic.DeepEqual(in.Spec, cur.Spec) {
			s.protocol = append(s.protocol, fmt.Sprintf("%s: %s sent a spec of %+v over %+v", time.Since(s.start), proc, in.Spec, cur.Spec))
		}
		before := findCondition(cur.Status.Conditions, ConditionHealthy)
		after := findCondition(in.Status.Conditions, ConditionHealthy)
		if !apiequality.Semantic.DeepEqual(before, after) {
			s.protocol = append(s.protocol, fmt.Sprintf("%s: %s changed Healthy from %+v to %+v", time.Since(s.start), proc, before, after))
		}
	}
	next := cur.DeepCopy()
	next.Status = in.Status
	next.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate,
		APIVersion: addonsv1alpha1.GroupVersion.String(), Time: ptr.To(metav1.NewTime(time.Now())), Subresource: "status"}}
	old, nw := cur.Status.LastHeartbeatTime.Time, in.Status.LastHeartbeatTime.Time
	s.putAI(next, "status")
	rv, _ := strconv.ParseInt(next.ResourceVersion, 10, 64)
	s.hbs = append(s.hbs, simHB{at: time.Now(), proc: proc, old: old, new: nw, rv: rv, period: s.period(),
		ghost: ghost, sentAt: sentAt, moved: !old.Equal(nw)})
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// simStream is one watch: a goroutine of the bubble that delivers its
// events in order, each after a delay, through a channel-backed body.
type simStream struct {
	srv      *simServer
	proc     *simProc
	resource string
	name     string
	body     *simBody
	rng      *rand.Rand // per-event delays (owned by the goroutine)
	timeout  time.Duration

	mu sync.Mutex
	// queue holds frames not yet delivered, each with the time it was
	// queued.
	queue        []simQueued
	notify       chan struct{} // capacity 1
	stalledUntil time.Time
	end          chan struct{} // closed by stop
	endErr       error         // what the client reads once end is closed (io.EOF: a clean close)
	stopped      bool
}

type simQueued struct {
	at    time.Time // queued
	due   time.Time // to be delivered (zero until drawn)
	frame []byte
}

// simBody is a streamed response body: Read takes the frames the stream's
// goroutine sends, in order, and then the end.
type simBody struct {
	frames    chan []byte
	done      chan struct{} // closed by Close (the client)
	closeOnce sync.Once
	end       chan struct{} // closed once the stream has delivered its last frame
	endErr    error         // set before end is closed
	cur       []byte
}

func (b *simBody) Read(p []byte) (int, error) {
	for len(b.cur) == 0 {
		select {
		case f := <-b.frames:
			b.cur = f
		case <-b.end:
			return 0, b.endErr
		case <-b.done:
			return 0, errors.New("read on a closed body")
		}
	}
	n := copy(p, b.cur)
	b.cur = b.cur[n:]
	return n, nil
}

func (b *simBody) Close() error {
	b.closeOnce.Do(func() { close(b.done) })
	return nil
}

// openStream starts a watch for r. The caller holds mu.
func (s *simServer) openStream(r *simRequest) simResponse {
	resource, name, hist := "leases", s.leaseName, s.leaseHist
	var cur runtime.Object
	if s.lease != nil {
		cur = s.leaseOut()
	}
	if r.kind == "ai-watch" {
		resource, name, hist = "addoninstances", s.name, s.aiHist
		cur = nil
		if s.ai != nil {
			cur = s.ai
		}
	}
	if fs := r.query.Get("fieldSelector"); fs != "metadata.name="+name {
		s.stats.unexpected++
		code, b := simStatus(apierrors.NewBadRequest("the sim serves watches of one object by name, not " + fs))
		return simResponse{code: code, body: b}
	}
	timeout := 10 * time.Minute
	if v, err := strconv.Atoi(r.query.Get("timeoutSeconds")); err == nil && v > 0 {
		timeout = time.Duration(v) * time.Second
	}
	st := &simStream{srv: s, proc: r.proc, resource: resource, name: name, timeout: timeout,
		rng:    r.proc.streamRand(r.kind),
		notify: make(chan struct{}, 1), end: make(chan struct{}),
		body: &simBody{frames: make(chan []byte), done: make(chan struct{}), end: make(chan struct{})}}
	now := time.Now()
	rvParam := r.query.Get("resourceVersion")
	switch {
	case r.query.Get("sendInitialEvents") == "true":
		if cur != nil {
			st.queue = append(st.queue, simQueued{at: now, frame: simFrame(watch.Added, cur)})
		}
		bm := &addonsv1alpha1.AddonInstance{
			TypeMeta: metav1.TypeMeta{APIVersion: addonsv1alpha1.GroupVersion.String(), Kind: "AddonInstance"},
			ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.FormatInt(s.rv, 10),
				Annotations: map[string]string{simInitialEventsEnd: "true"}},
		}
		st.queue = append(st.queue, simQueued{at: now, frame: simFrame(watch.Bookmark, bm)})
	case rvParam == "" || rvParam == "0":
		if cur != nil {
			st.queue = append(st.queue, simQueued{at: now, frame: simFrame(watch.Added, cur)})
		}
	default:
		from, err := strconv.ParseInt(rvParam, 10, 64)
		if err != nil || from < s.compacted {
			_, b := simStatus(apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %s (%d)", rvParam, s.compacted)))
			var st metav1.Status
			_ = json.Unmarshal(b, &st)
			frame := simFrame(watch.Error, &st)
			s.stats.fault("watch-expired-410")
			return simResponse{code: http.StatusOK, stream: s.startStream(&simStream{srv: s, proc: r.proc, resource: resource, name: name,
				timeout: timeout, rng: r.proc.streamRand(r.kind), notify: make(chan struct{}, 1), end: make(chan struct{}),
				queue: []simQueued{{at: now, frame: frame}}, stopped: true, endErr: io.EOF,
				body: &simBody{frames: make(chan []byte), done: make(chan struct{}), end: make(chan struct{})}})}
		}
		for _, ev := range hist {
			if ev.rv > from {
				st.queue = append(st.queue, simQueued{at: now, frame: ev.frame})
			}
		}
	}
	if s.ended {
		st.stopped, st.endErr = true, io.EOF
	}
	return simResponse{code: http.StatusOK, stream: s.startStream(st)}
}

// startStream registers st and starts its goroutine. The caller holds mu.
func (s *simServer) startStream(st *simStream) *simStream {
	if st.stopped {
		close(st.end)
	} else {
		s.streams[st] = struct{}{}
	}
	if p, ok := s.partitions[st.proc]; ok && p.blackhole && time.Now().Before(p.until) {
		st.stalledUntil = p.until
	}
	go st.run()
	return st
}

// push queues an event. The caller holds the server's mu.
func (st *simStream) push(ev simEvent) {
	st.mu.Lock()
	st.queue = append(st.queue, simQueued{at: time.Now(), frame: ev.frame})
	st.mu.Unlock()
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

// stop ends the stream after what it has delivered: io.EOF is a clean close
// (the client resumes from the last version), another error a broken one.
// The caller holds the server's mu.
func (st *simStream) stop(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stopped {
		return
	}
	st.stopped, st.endErr = true, err
	close(st.end)
	delete(st.srv.streams, st)
}

// stall holds back delivery until until (a watch cache that lags, a
// connection that is silent).
func (st *simStream) stall(until time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if until.After(st.stalledUntil) {
		st.stalledUntil = until
	}
}

// run delivers the stream's events in order, each one its delay after it was
// queued (and never before the one before it), until the stream is stopped,
// times out or the client closes the body.
func (st *simStream) run() {
	b := st.body
	timeout := time.NewTimer(st.timeout)
	defer timeout.Stop()
	var last time.Time
	ended := false // stopped cleanly: deliver what is queued at once, then end
	finish := func(err error) {
		b.endErr = err
		close(b.end)
	}
	closed := func() {
		st.srv.mu.Lock()
		st.stop(io.EOF)
		st.srv.mu.Unlock()
	}
	for {
		// Each event's delay is drawn once (outside st.mu: delay takes the
		// server's), and it never overtakes the one before it.
		st.mu.Lock()
		undrawn := len(st.queue) > 0 && st.queue[0].due.IsZero()
		st.mu.Unlock()
		var delay time.Duration
		if undrawn {
			delay = st.delay()
		}
		st.mu.Lock()
		var frame []byte
		var at time.Time
		if len(st.queue) > 0 {
			q := &st.queue[0]
			if q.due.IsZero() {
				q.due = q.at.Add(delay)
				if q.due.Before(last) {
					q.due = last
				}
			}
			frame, at = q.frame, q.due
			if st.stalledUntil.After(at) {
				at = st.stalledUntil
			}
		}
		st.mu.Unlock()
		if frame == nil {
			if ended {
				finish(st.endErr)
				return
			}
			select {
			case <-st.notify:
			case <-st.end:
				ended = true
			case <-timeout.C:
				closed()
			case <-b.done:
				closed()
				return
			}
			continue
		}
		if d := time.Until(at); d > 0 && !ended {
			wait := time.NewTimer(d)
			select {
			case <-wait.C:
			case <-st.end:
				// A clean close delivers what was queued first; a broken
				// one loses it.
				if st.endErr != io.EOF {
					wait.Stop()
					finish(st.endErr)
					return
				}
				ended = true
			case <-timeout.C:
				closed()
			case <-b.done:
				wait.Stop()
				closed()
				return
			}
			wait.Stop()
			continue // look again: a stall may have begun meanwhile
		}
		select {
		case b.frames <- frame:
			last = time.Now()
			st.mu.Lock()
			st.queue = st.queue[1:]
			st.mu.Unlock()
		case <-b.done:
			closed()
			return
		}
	}
}

// delay is how long one event takes to reach the client: a hundredth of a
// period, up to half a period in a storm.
func (st *simStream) delay() time.Duration {
	st.srv.mu.Lock()
	p, storm := st.srv.period(), time.Now().Before(st.srv.storm.until)
	st.srv.mu.Unlock()
	u := st.rng.Float64()
	if storm {
		return time.Duration(u * float64(p) / 2)
	}
	return time.Duration(u * float64(p) / 100)
}

// closeAll ends every stream (teardown).
func (s *simServer) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	for st := range s.streams {
		st.stop(io.EOF)
	}
}

// streamsOf are the open streams of proc (all when proc is nil). The caller
// holds mu.
func (s *simServer) streamsOf(proc *simProc) []*simStream {
	var out []*simStream
	for st := range s.streams {
		if proc == nil || st.proc == proc {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b *simStream) int { return strings.Compare(a.resource, b.resource) })
	return out
}

// Errors a process sees for a broken connection.
var (
	errSimRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	errSimReset   = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	errSimLost    = errors.New("http2: client connection lost")
	// errSimStream breaks a watch so that client-go reports an error event
	// (not a probable EOF, which ends the watch as if closed).
	errSimStream = errors.New("stream error: stream ID 7; INTERNAL_ERROR; received from peer")
)

// simTransport is one process's connection to the simServer.
type simTransport struct {
	srv  *simServer
	proc *simProc
}

// simDraw is what the fault sources decided for one request; drawn in full
// for every request, so that the draws of a kind stay aligned whatever the
// weather.
type simDraw struct {
	u [8]float64
}

func (t *simTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	s, proc := t.srv, t.proc
	ctx := req.Context()
	kind, name := s.classify(req)
	var d simDraw
	proc.draw(kind, &d)
	sent := time.Now()
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
	}
	r := &simRequest{proc: proc, method: req.Method, kind: kind, name: name, query: req.URL.Query(), body: body, sentAt: sent}

	s.mu.Lock()
	if proc.dead.Load() {
		s.mu.Unlock()
		return nil, errSimRefused
	}
	storm := time.Now().Before(s.storm.until)
	failRate, stormEnd := s.storm.failRate, s.storm.until
	part, parted := s.partitions[proc]
	parted = parted && time.Now().Before(part.until)
	p := s.period()
	s.mu.Unlock()

	if storm {
		defer func() {
			s.mu.Lock()
			if now := time.Now(); now.After(s.stormTails[stormEnd]) {
				s.stormTails[stormEnd] = now
			}
			s.mu.Unlock()
		}()
	}
	if parted {
		if !part.blackhole {
			s.count("partition-refused")
			return nil, errSimRefused
		}
		s.count("partition-blackholed")
		lost := time.NewTimer(45 * time.Second)
		defer lost.Stop()
		defer func() {
			s.mu.Lock()
			s.blackholed[proc] = time.Now()
			s.mu.Unlock()
		}()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-lost.C:
			return nil, errSimLost
		}
	}
	delay := func(u, v float64) time.Duration {
		if !storm {
			return time.Duration(u * float64(p) / 100)
		}
		switch {
		case v < 0.7:
			return time.Duration(u * float64(p) / 10)
		case v < 0.95:
			return time.Duration(u * float64(p) / 2)
		default:
			return time.Duration(u * float64(p) * 2)
		}
	}
	pre, post := delay(d.u[0], d.u[1]), delay(d.u[2], d.u[3])
	failing := storm && d.u[4] < failRate
	mode := d.u[5]
	if storm && pre > p/2 {
		s.count("delay-long")
	}

	if pre > 0 {
		wait := time.NewTimer(pre)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			// The client gave up while the request was on its way: it
			// reaches the server anyway, or not.
			if d.u[6] < 0.5 && !(failing && mode < 0.7) {
				r.ghost = true
				s.count("ghost")
				left := pre - time.Since(sent)
				go func() {
					time.Sleep(left)
					if resp := s.apply(r); resp.stream != nil {
						resp.stream.body.Close()
					}
				}()
			}
			return nil, ctx.Err()
		}
	}
	if failing && mode < 0.4 {
		s.count("fail-503")
		code, b := simStatus(apierrors.NewServiceUnavailable("the sim's storm"))
		return s.response(req, code, b, nil), nil
	}
	if failing && mode < 0.7 {
		s.count("fail-refused")
		return nil, errSimRefused
	}
	resp := s.apply(r)
	if failing {
		s.count("fail-reset-after-apply")
		if resp.stream != nil {
			resp.stream.body.Close()
		}
		return nil, errSimReset
	}
	if post > 0 {
		wait := time.NewTimer(post)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			if resp.stream != nil {
				resp.stream.body.Close()
			}
			return nil, ctx.Err()
		}
	}
	return s.response(req, resp.code, resp.body, resp.stream), nil
}

func (s *simServer) count(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.fault(kind)
}

// response builds the HTTP response: JSON, stamped with the server's Date.
func (s *simServer) response(req *http.Request, code int, body []byte, st *simStream) *http.Response {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	resp := &http.Response{StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h, Request: req}
	if st != nil {
		resp.Body = st.body
		resp.ContentLength = -1
		return resp
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	return resp
}

// simRandSeed derives the seed of one source from the schedule's seed and
// names (a process, a request kind).
func simRandSeed(seed uint64, names ...string) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, seed)
	for _, n := range names {
		h.Write([]byte{0})
		h.Write([]byte(n))
	}
	return h.Sum64()
}
