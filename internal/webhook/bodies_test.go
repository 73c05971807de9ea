package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// post sends body to url with the given declared length (-1: unknown,
// chunked) and returns the status and the response body.
func post(t *testing.T, url string, body io.Reader, length int64) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = length
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// Whoever can reach the port cannot make the webhook hold more request
// bodies than it has room for: a body declared too large is refused before
// any of it is read, one of unknown length counts as the largest allowed
// while it is read, a review that finds no room waits briefly and is
// answered 503, and a body trickled slower than the read timeout is cut off
// and its room given back.
func TestRequestBodiesAreBounded(t *testing.T) {
	h := &Handler{Config: injectCfg, Log: logr.Discard(),
		inFlight: 2 * maxBodyBytes, readTimeout: 2 * time.Second}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	small := review(`{"metadata":{"name":"d"}}`)

	// A body that never arrives: the answer comes anyway, so none of it
	// was waited for.
	never, neverW := io.Pipe()
	t.Cleanup(func() { neverW.Close() })
	if code, msg := post(t, srv.URL, never, maxBodyBytes+1); code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than") {
		t.Errorf("declared too large: %d %s, want 413", code, msg)
	}

	// Two bodies of unknown length, held open, take all the room.
	type result struct {
		code int
		msg  string
	}
	held := make([]*io.PipeWriter, 2)
	done := make(chan result, len(held))
	for i := range held {
		r, w := io.Pipe()
		held[i] = w
		go func() {
			code, msg := post(t, srv.URL, r, -1)
			done <- result{code, msg}
		}()
		if _, err := w.Write([]byte(`{"apiVersion":`)); err != nil { // the handler is reading it now
			t.Fatal(err)
		}
	}
	if code, msg := post(t, srv.URL, strings.NewReader(small), int64(len(small))); code != http.StatusServiceUnavailable || !strings.Contains(msg, "in flight") {
		t.Errorf("with no room left: %d %s, want 503", code, msg)
	}
	// One ends (a broken review): its room is given back.
	_ = held[0].Close()
	if r := <-done; r.code != http.StatusBadRequest {
		t.Errorf("the ended body: %d %s, want 400", r.code, r.msg)
	}
	if code, msg := post(t, srv.URL, strings.NewReader(small), int64(len(small))); code != http.StatusOK {
		t.Errorf("with room again: %d %s, want 200", code, msg)
	}
	// The other never ends: the read timeout cuts it off.
	if r := <-done; r.code != http.StatusBadRequest || !strings.Contains(r.msg, "timeout") {
		t.Errorf("the trickled body: %d %s, want 400 naming the timeout", r.code, r.msg)
	}
	_ = held[1].Close()
	if code, msg := post(t, srv.URL, strings.NewReader(small), int64(len(small))); code != http.StatusOK {
		t.Errorf("after the timeout: %d %s, want 200", code, msg)
	}
}
