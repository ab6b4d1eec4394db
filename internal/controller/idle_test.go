package controller_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// kubeCallCounter counts a manager's Kubernetes API requests by method and
// path.
type kubeCallCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func newKubeCallCounter() *kubeCallCounter { return &kubeCallCounter{counts: map[string]int{}} }

func (k *kubeCallCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		k.mu.Lock()
		k.counts[r.Method+" "+r.URL.Path]++
		k.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// count sums the requests of method whose path contains every one of parts.
func (k *kubeCallCounter) count(method string, parts ...string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
next:
	for key, v := range k.counts {
		if !strings.HasPrefix(key, method+" ") {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(key, p) {
				continue next
			}
		}
		n += v
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClusterPollReadsCredentialsOnlyWhenChanged: a connected cluster's
// polls do not read its credential Secret again (the manager caches no
// Secret contents, so each read is a GET to the API server); a change to
// the Secret makes the next poll read it.
func TestClusterPollReadsCredentialsOnlyWhenChanged(t *testing.T) {
	calls := newKubeCallCounter()
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{kubeCalls: calls})
	f := newFixture(t, sim, nil) // polls every second
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	secret := f.cluster.Spec.Credentials.TokenID.Name
	time.Sleep(time.Second)
	before := calls.count(http.MethodGet, "/secrets/"+secret)
	time.Sleep(4 * time.Second)
	if n := calls.count(http.MethodGet, "/secrets/"+secret) - before; n != 0 {
		t.Errorf("%d reads of the credential Secret over 4 polls of an unchanged cluster, want 0", n)
	}

	s := &corev1.Secret{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: secretNamespace, Name: secret}, s); err != nil {
		t.Fatal(err)
	}
	s.Data["unused"] = []byte("x")
	if err := env.Client.Update(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the changed Secret read again", func() error {
		if calls.count(http.MethodGet, "/secrets/"+secret) == before {
			return errors.New("not read again yet")
		}
		return nil
	})
}

// TestClusterStatusWriteStartsNoPoll: a write of the cluster's status alone
// (what every poll that changed something does) does not start another
// poll before the interval's.
func TestClusterStatusWriteStartsNoPoll(t *testing.T) {
	sim := startSim(t, nil)
	var polls atomic.Int32
	count := func(r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/version") {
			polls.Add(1)
		}
	}
	sim.onRequest.Store(&count)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.PollInterval = &metav1.Duration{Duration: time.Minute}
	})
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	time.Sleep(time.Second)
	before := polls.Load()
	for range 3 {
		c := &hfv1.HypervisorCluster{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.cluster), c); err != nil {
			t.Fatal(err)
		}
		c.Status.LastPollTime = &metav1.Time{Time: time.Now()}
		if err := env.Client.Status().Update(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if n := polls.Load() - before; n != 0 {
		t.Errorf("%d polls after 3 status writes within the 1-minute interval, want 0", n)
	}
}
