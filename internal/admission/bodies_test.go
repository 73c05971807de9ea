package admission

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
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

// startBody sends the head of a request with a body of length bytes and the
// first bytes of it, and leaves the rest unsent.
func startBody(t *testing.T, addr string, length int64) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := fmt.Sprintf("POST / HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"apiVersion\":", length)
	if _, err := c.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	return c
}

// answer reads the response on a connection of startBody.
func answer(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// Whoever can reach the port cannot make the webhook hold more request
// bodies than it has room for: a body declared too large is refused before
// any of it is read, one of unknown length is refused too, a review that
// finds no room waits briefly and is answered 503, and a body trickled
// slower than the read timeout is cut off and its room given back.
func TestRequestBodiesAreBounded(t *testing.T) {
	h := &Handler{Config: injectCfg, Log: logr.Discard(),
		// The read timeout outlasts a review's wait for room, so the 503 below
		// is not decided by which of the two runs out first.
		inFlight: 2 * MaxBodyBytes, readTimeout: 3 * bodyWait}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	small := string(reviewOf(t, []byte(`{"metadata":{"name":"d"}}`), false))

	// A body that never arrives: the answer comes anyway, so none of it
	// was waited for.
	never, neverW := io.Pipe()
	t.Cleanup(func() { neverW.Close() })
	if code, msg := post(t, srv.URL, never, MaxBodyBytes+1); code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than") {
		t.Errorf("declared too large: %d %s, want 413", code, msg)
	}

	// A body of unknown length would have to be read to be bounded.
	if code, msg := post(t, srv.URL, io.MultiReader(strings.NewReader(small)), -1); code != http.StatusLengthRequired || !strings.Contains(msg, "Content-Length") {
		t.Errorf("unknown length: %d %s, want 411", code, msg)
	}

	// Two bodies of the largest length, sent in part and held open, take
	// all the room.
	held := []net.Conn{startBody(t, srv.Listener.Addr().String(), MaxBodyBytes), startBody(t, srv.Listener.Addr().String(), MaxBodyBytes)}
	full := func(context.Context) (bool, error) {
		if h.bodyRoom().TryAcquire(1) {
			h.bodyRoom().Release(1)
			return false, nil
		}
		return true, nil
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 30*time.Second, true, full); err != nil {
		t.Fatal("the two held bodies never took the room")
	}
	if code, msg := post(t, srv.URL, strings.NewReader(small), int64(len(small))); code != http.StatusServiceUnavailable || !strings.Contains(msg, "in flight") {
		t.Errorf("with no room left: %d %s, want 503", code, msg)
	}
	// One client goes away: its room is given back.
	_ = held[0].Close()
	ok := false
	for range 50 { // the handler notices the closed connection at its next read
		if code, _ := post(t, srv.URL, strings.NewReader(small), int64(len(small))); code == http.StatusOK {
			ok = true
			break
		}
	}
	if !ok {
		t.Errorf("no room again after a client went away")
	}
	// The other never sends the rest: the read timeout cuts it off.
	if code, msg := answer(t, held[1]); code != http.StatusBadRequest || !strings.Contains(msg, "timeout") {
		t.Errorf("the trickled body: %d %s, want 400 naming the timeout", code, msg)
	}
	_ = held[1].Close()
	if code, msg := post(t, srv.URL, strings.NewReader(small), int64(len(small))); code != http.StatusOK {
		t.Errorf("after the timeout: %d %s, want 200", code, msg)
	}
}
