package webhook

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// signingKeyField is the Secret's key holding the record signing key.
const signingKeyField = "key"

// SigningKey is the key that signs the status records (inject.Record), kept
// in a Secret of the webhook's namespace so that every replica signs with
// the same key and the RBAC controller, on whichever replica leads, verifies
// with it. Every replica loads it at start; the first to find none creates
// it (a create is atomic, so all end up with the winner's). It is never
// rotated: a record signed with a lost key is one the RBAC controller cannot
// tell from a forged one, so it binds nothing (see internal/rbac) until the
// Deployment's next admission signs it anew.
type SigningKey struct {
	// Reader reads the Secret straight from the API server (a get by name,
	// which RBAC can limit to that name); Writer creates it.
	Reader client.Reader
	Writer client.Client
	Secret types.NamespacedName
	Log    logr.Logger

	key atomic.Pointer[[]byte]
}

// Key returns the key, nil until it is loaded.
func (k *SigningKey) Key() []byte {
	if p := k.key.Load(); p != nil {
		return *p
	}
	return nil
}

// NeedLeaderElection is false: every replica signs.
func (k *SigningKey) NeedLeaderElection() bool { return false }

// Start loads the key, creating it when there is none, retrying failures
// with a backoff until it succeeds or ctx ends.
func (k *SigningKey) Start(ctx context.Context) error {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Cap: 10 * time.Second, Steps: 1 << 30}
	for ctx.Err() == nil {
		key, err := k.load(ctx)
		if err == nil {
			k.key.Store(&key)
			k.Log.Info("loaded the status record signing key", "secret", k.Secret.String())
			return nil
		}
		if ctx.Err() == nil {
			k.Log.Error(err, "loading the status record signing key failed: retrying", "secret", k.Secret.String())
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff.Step()):
		}
	}
	return nil
}

func (k *SigningKey) load(ctx context.Context) ([]byte, error) {
	key, err := k.read(ctx)
	if !apierrors.IsNotFound(err) {
		return key, err
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	s := corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: k.Secret.Namespace, Name: k.Secret.Name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "addon-heartbeat"}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{signingKeyField: key},
	}
	if err := k.Writer.Create(ctx, &s); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Another replica was first: its key is the one.
			return k.read(ctx)
		}
		return nil, fmt.Errorf("creating secret %s: %w", k.Secret, err)
	}
	return key, nil
}

func (k *SigningKey) read(ctx context.Context) ([]byte, error) {
	var s corev1.Secret
	if err := k.Reader.Get(ctx, k.Secret, &s); err != nil {
		return nil, fmt.Errorf("reading secret %s: %w", k.Secret, err)
	}
	if key := s.Data[signingKeyField]; len(key) >= 32 {
		return key, nil
	}
	return nil, fmt.Errorf("secret %s has no %q of 32 bytes or more: delete it to have a new key made", k.Secret, signingKeyField)
}

// Checker is a readiness check that passes once the key is loaded: before,
// opted-in Deployments would get unsigned records.
func (k *SigningKey) Checker() func(*http.Request) error {
	return func(*http.Request) error {
		if k.Key() == nil {
			return errors.New("the status record signing key is not loaded yet")
		}
		return nil
	}
}
