package frontend

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
)

// predictingIndex is realPrefixIndex whose predictions live a minute, as
// the replica's do (realPrefixIndex's expire at once).
type predictingIndex struct{ realPrefixIndex }

func (p predictingIndex) Predict(worker string, seq []uint64) {
	_ = p.ix.Predict(worker, seq, time.Minute)
}

func TestASessionsSecondTurnLandsOnItsFirstTurnsWorkerWhenBlockSizesDiffer(t *testing.T) {
	ix, err := kvindex.New(kvindex.DefaultConfig(), clock.Real{}, nil, nil)
	require.NoError(t, err)
	page1, page16 := newUpstream(t, 2), newUpstream(t, 2)
	// One model on SGLang at page size 1 beside vLLM at 16: the request
	// is hashed at both sizes, and each worker's prefix (here the routers'
	// own predictions of turn one) is found at its own size.
	entries := staticWorkers{
		{ID: "w1", URL: page1.URL(), Model: "m", BlockSize: 1},
		{ID: "w2", URL: page16.URL(), Model: "m", BlockSize: 16},
	}
	pol := DefaultPolicy()
	actor := startActor(t, pol, []scheduler.Worker{
		{ID: "w1", URL: page1.URL(), BlockSize: 1, KVBlocks: 1 << 16},
		{ID: "w2", URL: page16.URL(), BlockSize: 16, KVBlocks: 1 << 12},
	})
	rec := &recordingAdmitter{next: NewLocalAdmitter(actor)}
	table := scheduler.NewSessionTable(100, time.Hour)
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: rec, Workers: entries, Index: predictingIndex{realPrefixIndex{ix}}, Policy: pol, Sessions: table})
	base := startServer(t, s)

	text := func(tag string, n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "%s%d ", tag, i)
		}
		return b.String()
	}
	// Turn one of each session is placed on a chosen worker (an allow
	// list, as a client's constraint would), so both block sizes hold
	// sessions; turn two extends the conversation without constraint.
	for i, first := range []string{"w1", "w2", "w1", "w2"} {
		key := map[string]string{"x-session-id": fmt.Sprintf("s%d", i)}
		turn1 := text(fmt.Sprintf("s%dturn", i), 40)
		status, h, body := post(t, base+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":"`+turn1+`"}`,
			map[string]string{"x-session-id": key["x-session-id"], HeaderAllowedWorkers: first})
		require.Equal(t, http.StatusOK, status, body)
		require.Equal(t, first, h.Get(HeaderRoutedWorker))

		turn2 := turn1 + text("reply", 8) + text("next", 8)
		status, h, body = post(t, base+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":"`+turn2+`"}`, key)
		require.Equal(t, http.StatusOK, status, body)
		assert.Equalf(t, first, h.Get(HeaderRoutedWorker), "session %d's turn two", i)
		r := rec.last()
		assert.Equal(t, first, r.Session.Worker, "the session's worker reached the scheduler")
		bs := map[string]int{"w1": 1, "w2": 16}[first]
		assert.Positivef(t, r.OverlapBlocks(first), "turn one's prefix found on %s at its own block size %d", first, bs)

		// A turn sharing no prefix with the others (a new system prompt,
		// a tool's long output) stays by the session alone.
		status, h, body = post(t, base+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":"`+text(fmt.Sprintf("s%dother", i), 30)+`"}`, key)
		require.Equal(t, http.StatusOK, status, body)
		assert.Equalf(t, first, h.Get(HeaderRoutedWorker), "session %d's unrelated turn three", i)
		r = rec.last()
		assert.Zero(t, r.OverlapBlocks(first))
	}
	assert.Equal(t, 4, table.Len())
}
