package localcluster

import (
	"os"
	"sync"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// Every reporter of a Deployment runs as the same ServiceAccount, so starting
// one rewrites the kubeconfig file that the ones started just before may be
// reading at that moment. A reader must always find a whole kubeconfig with a
// token, never an empty or truncated file (which made a reporter exit with
// "no configuration has been provided").
func TestServiceAccountKubeconfigIsNeverSeenPartlyWritten(t *testing.T) {
	c, err := Start(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	path, err := c.ServiceAccountKubeconfig(t.Context(), "default", "addon")
	if err != nil {
		t.Fatal(err)
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	reads, bad := 0, []string{}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				data, err := os.ReadFile(path)
				problem := ""
				// As a reporter loads it (client-go's clientcmd).
				switch cfg, lerr := clientcmd.RESTConfigFromKubeConfig(data); {
				case err != nil:
					problem = err.Error()
				case lerr != nil:
					problem = lerr.Error()
				case cfg.BearerToken == "":
					problem = "no token in " + string(data)
				}
				mu.Lock()
				reads++
				if problem != "" && len(bad) < 5 {
					bad = append(bad, problem)
				}
				mu.Unlock()
			}
		}()
	}
	for range 40 {
		if _, err := c.ServiceAccountKubeconfig(t.Context(), "default", "addon"); err != nil {
			t.Error(err)
			break
		}
	}
	close(done)
	wg.Wait()
	t.Logf("%d reads while the file was rewritten 40 times", reads)
	if len(bad) > 0 {
		t.Errorf("readers saw a partly written kubeconfig: %q", bad)
	}
}
