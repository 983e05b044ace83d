package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/nanoservice/core-fanout/fanout/status"
)

// ActionTimeout bounds how long an action's request waits for the daemon.
const ActionTimeout = 10 * time.Second

// maxActionBody bounds an action's request body.
const maxActionBody = 4 << 10

// ErrUnavailable, wrapped, is what an action the daemon cannot take now
// returns (it does not take part in a cluster yet, or serves no clients):
// the answer is 503 with the error's text.
var ErrUnavailable = errors.New("not now")

// ActionsConfig configures Actions. Both functions are required; by says
// who asked (see Actions).
type ActionsConfig struct {
	// Pause pauses (paused) or resumes the cluster's deliveries and returns
	// the pause in force.
	Pause func(ctx context.Context, paused bool, by string) (*status.Pause, error)
	// DrainClient drains the clients of this daemon whose session id is id
	// or, when id is 0, named name, and returns them as they stood; none
	// when there is no such client.
	DrainClient func(ctx context.Context, id uint64, name, by string) ([]status.Client, error)
}

// ActionRequest is the body of an action's request, all fields optional
// but the client for drain-client.
type ActionRequest struct {
	By   string `json:"by,omitempty"`   // who asks, as the operator names themselves
	Name string `json:"name,omitempty"` // drain-client: the client's name
	ID   uint64 `json:"id,omitempty"`   // drain-client: the client's session id (instead of the name)
}

// PauseAnswer is the answer to pause and resume.
type PauseAnswer struct {
	Pause *status.Pause `json:"pause"`
}

// DrainAnswer is the answer to drain-client.
type DrainAnswer struct {
	Drained []status.Client `json:"drained"`
}

// Actions serves an operator's actions, each a POST with an optional
// ActionRequest as its JSON body:
//
//	/api/pause         pause the cluster's deliveries (PauseAnswer)
//	/api/resume        resume them (PauseAnswer)
//	/api/drain-client  drain a client of this daemon (DrainAnswer; 404 when none)
//
// The metrics listener serves it behind the metrics token, and refuses
// every action without one (metrics.HandlerConfig.Actions). Who asked is
// the name the request gives, if any, and its remote address.
func Actions(cfg ActionsConfig) http.Handler {
	mux := http.NewServeMux()
	pause := func(paused bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, by, ok := readAction(w, r)
			if !ok {
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), ActionTimeout)
			defer cancel()
			p, err := cfg.Pause(ctx, paused, by)
			if err != nil {
				actionFailed(w, err)
				return
			}
			writeJSON(w, http.StatusOK, PauseAnswer{Pause: p})
		}
	}
	mux.HandleFunc("POST /api/pause", pause(true))
	mux.HandleFunc("POST /api/resume", pause(false))
	mux.HandleFunc("POST /api/drain-client", func(w http.ResponseWriter, r *http.Request) {
		req, by, ok := readAction(w, r)
		if !ok {
			return
		}
		if req.ID == 0 && req.Name == "" {
			http.Error(w, `drain-client needs the client: {"name": "..."} or {"id": <session id>}`, http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), ActionTimeout)
		defer cancel()
		drained, err := cfg.DrainClient(ctx, req.ID, req.Name, by)
		if err != nil {
			actionFailed(w, err)
			return
		}
		if len(drained) == 0 {
			who := fmt.Sprintf("named %q", req.Name)
			if req.ID != 0 {
				who = fmt.Sprintf("of session %d", req.ID)
			}
			http.Error(w, "no client "+who+" is connected to this daemon", http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, DrainAnswer{Drained: drained})
	})
	return mux
}

// readAction reads an action's request and says who asked; false when it
// answered an error.
func readAction(w http.ResponseWriter, r *http.Request) (ActionRequest, string, bool) {
	var req ActionRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxActionBody))
	if err != nil {
		http.Error(w, fmt.Sprintf("read the request: %v", err), http.StatusRequestEntityTooLarge)
		return req, "", false
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, fmt.Sprintf("the request is not an action's JSON: %v", err), http.StatusBadRequest)
			return req, "", false
		}
	}
	return req, Who(req.By, r.RemoteAddr), true
}

// Who says who asked for an action: the name the request gave, if any,
// then the address it came from.
func Who(name, remote string) string {
	name = strings.Join(strings.Fields(name), " ")
	if name == "" {
		return remote
	}
	return name + " from " + remote
}

// actionFailed answers err: 503 for ErrUnavailable, else 500.
func actionFailed(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	if errors.Is(err, ErrUnavailable) {
		code = http.StatusServiceUnavailable
	}
	http.Error(w, err.Error(), code)
}

// writeJSON answers v as JSON with code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // fails only when the client went away
}
