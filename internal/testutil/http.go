package testutil

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// HTTPGet returns the status, body and header of a GET of url, with auth as
// the Authorization header when not empty. It fails the test when the
// request cannot be made or the body read, within 10 seconds.
func HTTPGet(t testing.TB, url, auth string) (int, string, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b), resp.Header
}
