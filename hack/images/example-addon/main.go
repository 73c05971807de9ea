// Command example-addon is an addon with no heartbeat code, for the
// real-node end-to-end test: it serves /healthz and /readyz, and its
// readiness can be turned off and on again over HTTP, as a real outage of the
// addon would:
//
//	POST /ready?value=false   readiness fails from now on
//	POST /ready?value=true    readiness succeeds again
//	GET  /env?name=NAME       the value of an environment variable
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", ":8080", "address to serve on")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	var ready atomic.Bool
	ready.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("POST /ready", func(w http.ResponseWriter, r *http.Request) {
		v, err := strconv.ParseBool(r.URL.Query().Get("value"))
		if err != nil {
			http.Error(w, "value must be true or false", http.StatusBadRequest)
			return
		}
		ready.Store(v)
		log.Info("readiness set", "ready", v)
		fmt.Fprintln(w, v)
	})
	mux.HandleFunc("GET /env", func(w http.ResponseWriter, r *http.Request) {
		v, ok := os.LookupEnv(r.URL.Query().Get("name"))
		if !ok {
			http.Error(w, "not set", http.StatusNotFound)
			return
		}
		fmt.Fprint(w, v)
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Info("serving", "addr", *addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("serving", "err", err)
		os.Exit(1)
	}
}
