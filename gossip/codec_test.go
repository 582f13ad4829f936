package gossip

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func sampleLoads() *loadsMsg {
	return &loadsMsg{
		Origin: "r1", Version: 1_700_000_000_123, Timestamp: 1_700_000_000_456, ShardBits: 6, Shard: 17, Part: 1,
		Entries: []workerEntry{
			{Worker: "w-a", Entry: Entry{Version: 1_700_000_000_000, Load: WorkerLoad{3, 4096, 70}, Digest: Digest{LastEventID: 99, Blocks: 512, Instance: 1 << 63}}},
			{Worker: "w-b", Entry: Entry{Version: 1_700_000_000_123, Load: WorkerLoad{-1, 0, 0}, Health: Health{SuspectSince: 1_700_000_000_100, RecoveredAt: 1_699_000_000_000}}},
		},
	}
}

func samplePrediction() *predictionMsg {
	return &predictionMsg{Origin: "r2", ID: 77, Timestamp: 5, Worker: "w-c", Expires: 10, Hashes: []uint64{1, 2, 1 << 63}}
}

func sampleState() State {
	return State{
		Origins: map[string]map[string]Entry{
			"r1": {"w-a": {Version: 10, Load: WorkerLoad{1, 2, 3}}, "w-b": {Version: 12, Digest: Digest{LastEventID: 7, Blocks: 8, Instance: 9}}},
			"r3": {"w-a": {Version: 4, Load: WorkerLoad{5, 0, 0}}},
		},
		Floors: map[string]uint64{"r3": 2, "gone": 40},
	}
}

func TestLoadsMessageRoundTrips(t *testing.T) {
	in := sampleLoads()
	kind, out, _, _, err := decodeMessage(appendLoads(nil, in))
	require.NoError(t, err)
	require.Equal(t, kindLoads, kind)
	require.Equal(t, in, out)
}

func TestPredictionMessageRoundTrips(t *testing.T) {
	in := samplePrediction()
	kind, _, out, _, err := decodeMessage(appendPrediction(nil, in))
	require.NoError(t, err)
	require.Equal(t, kindPrediction, kind)
	require.Equal(t, in, out)
}

func TestStateRoundTripsAndEncodesCanonically(t *testing.T) {
	in := sampleState()
	b := appendState(nil, 42, in)
	kind, _, _, out, err := decodeMessage(b)
	require.NoError(t, err)
	require.Equal(t, kindState, kind)
	require.Equal(t, int64(42), out.Timestamp)
	require.True(t, out.State.Equal(in), "decoded %+v, want %+v", out.State, in)
	require.Equal(t, b, appendState(nil, 42, out.State), "equal states encode to equal bytes")
}

func TestDecoderRejectsForeignVersionedAndCorruptInput(t *testing.T) {
	good := appendLoads(nil, sampleLoads())
	cases := map[string]struct {
		in   []byte
		want error
	}{
		"empty":             {nil, ErrForeign},
		"memberlist ping":   {[]byte{0, 1, 2, 3}, ErrForeign},
		"future version":    {append([]byte{'S', 'G', 9}, good[3:]...), ErrVersion},
		"unknown kind":      {[]byte{'S', 'G', codecVersion, 99}, ErrMalformed},
		"truncated":         {good[:len(good)-1], ErrMalformed},
		"trailing byte":     {append(append([]byte{}, good...), 0), ErrMalformed},
		"huge entry count":  {append(appendHeader(nil, kindState), 0, 0xff, 0xff, 0xff, 0xff, 0x0f), ErrMalformed},
		"node meta instead": {mustMeta(t, NodeMeta{ReplicaID: "x"}), ErrForeign},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, _, _, err := decodeMessage(c.in)
			require.ErrorIs(t, err, c.want)
		})
	}
}

func TestEntryVersionAboveMessageVersionIsRejected(t *testing.T) {
	m := sampleLoads()
	b := appendLoads(nil, m)
	// Re-encode with a message version below the entries' versions by
	// patching the fixed-width version field after the origin.
	off := 4 + 1 + len(m.Origin)
	copy(b[off:off+8], []byte{1, 0, 0, 0, 0, 0, 0, 0})
	_, _, _, _, err := decodeMessage(b)
	require.ErrorIs(t, err, ErrMalformed)
}

func mustMeta(t testing.TB, m NodeMeta) []byte {
	b, err := EncodeNodeMeta(m)
	require.NoError(t, err)
	return b
}

func TestNodeMetaRoundTripsAndStaysWithinMemberlistsLimit(t *testing.T) {
	m := NodeMeta{ReplicaID: "router-7", HTTPAddr: "10.0.0.7:8080", Version: "v1.2.3"}
	got, err := DecodeNodeMeta(mustMeta(t, m))
	require.NoError(t, err)
	require.Equal(t, m, got)

	// Three strings with one-byte lengths need 3 + 3 bytes of framing; with
	// two-byte lengths (over 127 bytes) 3 + 2 + 2 + 1.
	fits := NodeMeta{ReplicaID: "r", HTTPAddr: strings.Repeat("h", 250), Version: strings.Repeat("v", MaxMetaBytes-3-1-1-2-250-2)}
	b, err := EncodeNodeMeta(fits)
	require.NoError(t, err)
	require.Len(t, b, MaxMetaBytes)

	tooBig := fits
	tooBig.Version += "v"
	_, err = EncodeNodeMeta(tooBig)
	require.ErrorIs(t, err, ErrMetaTooLarge)

	cfg := testConfig("r")
	cfg.Meta = tooBig
	require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "a replica with oversized meta fails at start-up")
	_, err = DecodeNodeMeta(append(b, 0))
	require.Error(t, err, "decoder rejects meta over the limit")
}

func TestNodeMetaDecoderRejectsForeignAndFutureMeta(t *testing.T) {
	_, err := DecodeNodeMeta([]byte("{\"id\":1}"))
	require.ErrorIs(t, err, ErrForeign)
	_, err = DecodeNodeMeta([]byte{'S', 'M', 2, 0, 0, 0})
	require.ErrorIs(t, err, ErrVersion)
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add(appendLoads(nil, sampleLoads()))
	f.Add(appendPrediction(nil, samplePrediction()))
	f.Add(appendState(nil, 1, sampleState()))
	f.Add([]byte{'S', 'G', codecVersion, byte(kindState), 0, 1, 1, 'o', 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		kind, lm, pm, sm, err := decodeMessage(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrForeign) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// Whatever decodes re-encodes to something that decodes to the same.
		var again []byte
		switch kind {
		case kindLoads:
			again = appendLoads(nil, lm)
		case kindPrediction:
			again = appendPrediction(nil, pm)
		case kindState:
			again = appendState(nil, sm.Timestamp, sm.State)
		}
		kind2, lm2, pm2, sm2, err := decodeMessage(again)
		if err != nil || kind2 != kind {
			t.Fatalf("re-encoded %s does not decode: %v", kind, err)
		}
		switch kind {
		case kindLoads:
			require.Equal(t, lm, lm2)
		case kindPrediction:
			require.Equal(t, pm, pm2)
		case kindState:
			require.True(t, sm.State.Equal(sm2.State))
		}
	})
}

func FuzzDecodeNodeMeta(f *testing.F) {
	f.Add(mustMeta(f, NodeMeta{ReplicaID: "r1", HTTPAddr: "127.0.0.1:1", Version: "dev"}))
	f.Add([]byte{'S', 'M', 1})
	f.Add(bytes.Repeat([]byte{0xff}, 600))
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := DecodeNodeMeta(p)
		if err != nil {
			return
		}
		b, err := EncodeNodeMeta(m)
		require.NoError(t, err, "decoded meta re-encodes within the limit")
		m2, err := DecodeNodeMeta(b)
		require.NoError(t, err)
		require.Equal(t, m, m2)
	})
}

func TestRandomStatesRoundTripThroughTheCodec(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 1000 {
		s := randomState(r)
		_, _, _, out, err := decodeMessage(appendState(nil, 0, s))
		require.NoError(t, err)
		require.True(t, out.State.Equal(s), "state %+v decoded as %+v", s, out.State)
	}
}
