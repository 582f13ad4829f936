package frontend

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

func TestTheChosenDataParallelRankIsPinnedWithVLLMsHeader(t *testing.T) {
	// One API server for every rank, as vLLM with --data-parallel-size.
	ranks := make(chan string, 8)
	up := newUpstream(t, 2)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ranks <- r.Header.Get(HeaderDPRank)
		up.serve(w, r)
	}))
	t.Cleanup(api.Close)
	next := make(chan string, 8)
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
			w := <-next
			return &fakeTicket{grant: scheduler.Grant{RequestID: r.ID, Worker: w, WorkerURL: api.URL}}, nil
		}},
		Workers: staticWorkers{
			{ID: "e-dp0", URL: api.URL, Model: "m", BlockSize: 4, DPRank: 0, DPSize: 2},
			{ID: "e-dp1", URL: api.URL, Model: "m", BlockSize: 4, DPRank: 1, DPSize: 2},
			{ID: "plain", URL: api.URL, Model: "m", BlockSize: 4},
		},
	})
	base := startServer(t, s)
	for _, c := range []struct{ worker, header string }{{"e-dp1", "1"}, {"e-dp0", "0"}, {"plain", ""}} {
		next <- c.worker
		status, _, body := post(t, base+"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil)
		require.Equal(t, http.StatusOK, status, body)
		assert.Equal(t, c.header, <-ranks, "request granted to %s", c.worker)
	}
}

// sglangRendezvous is an SGLang prefill server and decode server: the
// decode server answers only after the prefill server has received its leg
// (as a decode server waits for its bootstrap room), so both legs' bodies
// are recorded when the client's answer arrives.
type sglangRendezvous struct {
	prefill, decode *httptest.Server
	up              *upstream
	prefillBodies   chan string
	decodeBodies    chan string
}

func newSGLangRendezvous(t *testing.T) *sglangRendezvous {
	p := &sglangRendezvous{up: &upstream{tokens: 2}, prefillBodies: make(chan string, 4), decodeBodies: make(chan string, 4)}
	seen := make(chan struct{}, 4)
	p.prefill = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.prefillBodies <- string(b)
		seen <- struct{}{}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"p"}`)
	}))
	t.Cleanup(p.prefill.Close)
	p.decode = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.decodeBodies <- string(b)
		select {
		case <-seen:
		case <-r.Context().Done():
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		p.up.serve(w, r)
	}))
	t.Cleanup(p.decode.Close)
	return p
}

func TestSGLangPairLegsNameTheDataParallelRanksAsSGLangsGatewayDoes(t *testing.T) {
	const client = `{"model":"m","prompt":"hi","max_tokens":2,"data_parallel_rank":3,"stream":false}`
	for _, c := range []struct {
		name                      string
		prefillRank, prefillSize  int
		decodeRank, decodeSize    int
		prefillExtra, decodeExtra map[string]any
		roomMod, roomRank         uint64
	}{
		{name: "both ranks", prefillRank: 1, prefillSize: 4, decodeRank: 2, decodeSize: 3,
			prefillExtra: map[string]any{"routed_dp_rank": 1.0},
			decodeExtra:  map[string]any{"routed_dp_rank": 2.0, "disagg_prefill_dp_rank": 1.0},
			roomMod:      4, roomRank: 1},
		{name: "a prefill rank and a plain decode server", prefillRank: 3, prefillSize: 4,
			prefillExtra: map[string]any{"routed_dp_rank": 3.0},
			decodeExtra:  map[string]any{"disagg_prefill_dp_rank": 3.0},
			roomMod:      4, roomRank: 3},
		{name: "a plain prefill server and a decode rank", decodeRank: 1, decodeSize: 2,
			prefillExtra: map[string]any{},
			decodeExtra:  map[string]any{"routed_dp_rank": 1.0}},
		{name: "plain servers", prefillExtra: map[string]any{}, decodeExtra: map[string]any{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newSGLangRendezvous(t)
			pw := WorkerEntry{ID: "p", URL: e.prefill.URL, Model: "m", BlockSize: 16, Role: wire.RolePrefill,
				KVTransfer: wire.TransferSGLang, BootstrapPort: 8998, DPRank: c.prefillRank, DPSize: c.prefillSize}
			dw := WorkerEntry{ID: "d", URL: e.decode.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode,
				KVTransfer: wire.TransferSGLang, DPRank: c.decodeRank, DPSize: c.decodeSize}
			rec := &grantRecorder{}
			s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec, pairGrant(pw, dw)), Workers: staticWorkers{pw, dw}})
			status, _, body := post(t, startServer(t, s)+"/v1/completions", client, nil)
			require.Equal(t, http.StatusOK, status, body)

			var orig, p, d map[string]any
			pb, db := <-e.prefillBodies, <-e.decodeBodies
			require.NoError(t, json.Unmarshal([]byte(client), &orig))
			require.NoError(t, json.Unmarshal([]byte(pb), &p))
			require.NoError(t, json.Unmarshal([]byte(db), &d))
			var pr, dr struct {
				Room *uint64 `json:"bootstrap_room"`
			}
			require.NoError(t, json.Unmarshal([]byte(pb), &pr))
			require.NoError(t, json.Unmarshal([]byte(db), &dr))
			require.NotNil(t, pr.Room, "the prefill leg has a room")
			require.NotNil(t, dr.Room, "the decode leg has a room")
			room := *pr.Room
			boot := map[string]any{"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998.0}
			want := func(extra map[string]any) map[string]any {
				m := map[string]any{}
				for k, v := range orig {
					m[k] = v
				}
				if _, ok := extra["routed_dp_rank"]; ok {
					delete(m, "data_parallel_rank") // SGLang's deprecated routed_dp_rank
				}
				for k, v := range boot {
					m[k] = v
				}
				m["bootstrap_room"] = d["bootstrap_room"]
				for k, v := range extra {
					m[k] = v
				}
				return m
			}
			assert.Equal(t, want(c.prefillExtra), p)
			assert.Equal(t, want(c.decodeExtra), d)
			assert.Equal(t, room, *dr.Room, "one room for both legs")
			assert.LessOrEqual(t, room, uint64(maxRoom))
			if c.roomMod > 0 {
				assert.Equal(t, c.roomRank, room%c.roomMod, "the room is aligned to the prefill rank")
			}
		})
	}
}

func TestAlignRoomKeepsTheRoomInSGLangsRange(t *testing.T) {
	assert.Equal(t, uint64(13), alignRoom(13, -1, 0), "no rank: unchanged")
	assert.Equal(t, uint64(13), alignRoom(13, 0, 1), "one rank: unchanged")
	assert.Equal(t, uint64(9), alignRoom(11, 1, 4))
	assert.Equal(t, uint64(11), alignRoom(11, 3, 4))
	top := alignRoom(maxRoom, 3, 5)
	assert.LessOrEqual(t, top, uint64(maxRoom))
	assert.Equal(t, uint64(3), top%5)
	for r := uint64(maxRoom - 10); r <= maxRoom; r++ {
		for rank := range 7 {
			a := alignRoom(r, rank, 7)
			require.LessOrEqual(t, a, uint64(maxRoom))
			require.Equal(t, uint64(rank), a%7)
		}
	}
}
