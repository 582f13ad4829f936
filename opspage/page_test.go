package opspage

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func local(context.Context) (json.RawMessage, error) { return json.RawMessage(`{"self":"r1"}`), nil }

func serve(t *testing.T, p *Page) string {
	t.Helper()
	mux := http.NewServeMux()
	for _, routes := range []map[string]http.Handler{p.ShellRoutes(), p.DataRoutes()} {
		for pattern, h := range routes {
			mux.Handle(pattern, h)
		}
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func get(t *testing.T, url string, header ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func TestTheTierListsEveryReplicaAndMarksThoseThatDoNotAnswer(t *testing.T) {
	var gotAuth string
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		require.Equal(t, "/debug/cluster", r.URL.Path)
		_, _ = io.WriteString(w, `{"self":"r2"}`)
	}))
	defer peer.Close()
	stuck := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stuck:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(stuck)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := ln.Addr().String()
	require.NoError(t, ln.Close())

	cfg := DefaultConfig()
	cfg.PeerTimeout = 200 * time.Millisecond
	p, err := New(cfg, Deps{Self: "r1", Local: local, Peers: func() []Peer {
		return []Peer{{ID: "r4", Addr: strings.TrimPrefix(slow.URL, "http://")}, {ID: "r1", Addr: "self"},
			{ID: "r3", Addr: gone}, {ID: "r2", Addr: strings.TrimPrefix(peer.URL, "http://")}, {ID: "r5"}}
	}})
	require.NoError(t, err)
	status, body, h := get(t, serve(t, p)+"/debug/tier", "Authorization", "Bearer admin")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "application/json", h.Get("Content-Type"))
	var tier Tier
	require.NoError(t, json.Unmarshal([]byte(body), &tier))
	require.Equal(t, "r1", tier.ServedBy)
	ids := []string{}
	for _, m := range tier.Members {
		ids = append(ids, m.ID)
	}
	require.Equal(t, []string{"r1", "r2", "r3", "r4", "r5"}, ids, "self first, then the peers by id, self once")
	require.True(t, tier.Members[0].Reachable)
	require.JSONEq(t, `{"self":"r1"}`, string(tier.Members[0].Doc))
	require.True(t, tier.Members[1].Reachable)
	require.JSONEq(t, `{"self":"r2"}`, string(tier.Members[1].Doc))
	require.Equal(t, "Bearer admin", gotAuth, "the caller's admin key goes to the peers")
	for _, m := range tier.Members[2:] {
		require.False(t, m.Reachable, m.ID)
		require.NotEmpty(t, m.Error, m.ID)
	}
	require.Equal(t, "no address registered", tier.Members[4].Error)
}

func TestAPeerAnsweringAnErrorIsUnreachableWithItsStatus(t *testing.T) {
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusUnauthorized)
	}))
	defer peer.Close()
	p, err := New(DefaultConfig(), Deps{Self: "r1", Local: local, Peers: func() []Peer {
		return []Peer{{ID: "r2", Addr: strings.TrimPrefix(peer.URL, "http://")}}
	}})
	require.NoError(t, err)
	tier := p.Tier(context.Background(), "")
	require.Len(t, tier.Members, 2)
	require.False(t, tier.Members[1].Reachable)
	require.Contains(t, tier.Members[1].Error, "401")
}

func TestThePageAndItsAssetsAreServedFromTheBinary(t *testing.T) {
	p, err := New(DefaultConfig(), Deps{Self: "r1", Local: local, Peers: func() []Peer { return nil }})
	require.NoError(t, err)
	base := serve(t, p)
	status, body, h := get(t, base+"/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, h.Get("Content-Type"), "text/html")
	require.Contains(t, body, `<script src="/ops/app.js">`)
	for _, asset := range []string{"/ops/app.js", "/ops/style.css"} {
		status, body, _ := get(t, base+asset)
		require.Equal(t, http.StatusOK, status, asset)
		require.NotEmpty(t, body, asset)
	}
	status, _, _ = get(t, base+"/ops/missing.js")
	require.Equal(t, http.StatusNotFound, status)
}

func TestConfigNamesTheBadField(t *testing.T) {
	err := Config{}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "PeerTimeout")
	_, err = New(DefaultConfig(), Deps{})
	require.ErrorIs(t, err, ErrInvalidConfig)
}
