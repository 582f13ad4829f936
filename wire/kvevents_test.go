package wire

import (
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func sampleBatch() *KVEventBatch {
	return &KVEventBatch{
		Worker: "worker-1", Instance: 0xDEADBEEF, FirstID: 41, TimeUnixNano: 1_700_000_000_123_456_789,
		Events: []KVEvent{
			{Kind: KVStored, Hashes: []uint64{1, 2}},
			{Kind: KVStored, Parent: 2, HasParent: true, Hashes: []uint64{3, math.MaxUint64}},
			{Kind: KVRemoved, Hashes: []uint64{3}},
			{Kind: KVCleared},
		},
	}
}

func TestKVEventBatchRoundTripsEveryEventKind(t *testing.T) {
	in := sampleBatch()
	out, err := DecodeKVEventBatch(AppendKVEventBatch(nil, in))
	require.NoError(t, err)
	require.Equal(t, in, out)
	require.Equal(t, uint64(44), out.LastID())
}

func TestKVEventBatchEncodingIsPinned(t *testing.T) {
	// Engines in other languages implement this format; a change here must
	// come with a new version byte.
	b := &KVEventBatch{Worker: "w", Instance: 2, FirstID: 3, TimeUnixNano: 4,
		Events: []KVEvent{{Kind: KVStored, Parent: 5, HasParent: true, Hashes: []uint64{6}}, {Kind: KVCleared}}}
	const want = "534b02" + "0177" + "0200000000000000" + "0300000000000000" + "0400000000000000" + "02" +
		"01" + "01" + "0500000000000000" + "01" + "0600000000000000" + "03"
	require.Equal(t, want, hex.EncodeToString(AppendKVEventBatch(nil, b)))
}

func TestAnEmptyBatchIsAHeartbeatEndingBeforeItsFirstID(t *testing.T) {
	b := &KVEventBatch{Worker: "w", Instance: 1, FirstID: 8}
	out, err := DecodeKVEventBatch(AppendKVEventBatch(nil, b))
	require.NoError(t, err)
	require.Empty(t, out.Events)
	require.Equal(t, uint64(7), out.LastID())
}

func TestDecodeKVEventBatchRejectsBadInputWithTypedErrors(t *testing.T) {
	good := AppendKVEventBatch(nil, sampleBatch())
	mutate := func(f func([]byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := map[string]struct {
		in   []byte
		want error
	}{
		"empty":          {nil, ErrMalformed},
		"bad magic":      {mutate(func(b []byte) []byte { b[0] = 'X'; return b }), ErrMalformed},
		"dump magic":     {AppendKVDumpChunk(nil, &KVDumpChunk{Worker: "w"}), ErrMalformed},
		"version 1":      {mutate(func(b []byte) []byte { b[2] = 1; return b }), ErrVersion},
		"future version": {mutate(func(b []byte) []byte { b[2] = 9; return b }), ErrVersion},
		"trailing bytes": {append(append([]byte(nil), good...), 0), ErrMalformed},
		"invalid worker": {AppendKVEventBatch(nil, &KVEventBatch{Worker: "a.b", FirstID: 1}), ErrMalformed},
		"event id zero":  {AppendKVEventBatch(nil, &KVEventBatch{Worker: "w"}), ErrMalformed},
		"id overflow":    {AppendKVEventBatch(nil, &KVEventBatch{Worker: "w", FirstID: math.MaxUint64, Events: []KVEvent{{Kind: KVCleared}, {Kind: KVCleared}}}), ErrMalformed},
		"unknown kind":   {AppendKVEventBatch(nil, &KVEventBatch{Worker: "w", FirstID: 1, Events: []KVEvent{{Kind: 9}}}), ErrMalformed},
		"bad parent flag": {func() []byte {
			b := AppendKVEventBatch(nil, &KVEventBatch{Worker: "w", FirstID: 1, Events: []KVEvent{{Kind: KVStored}}})
			b[3+2+24+1+1] = 7 // header, worker, instance+first_id+time, n_events, kind
			return b
		}(), ErrMalformed},
		"huge count": {append([]byte("SK\x02\x01w"+string(make([]byte, 24))), 0xff, 0xff, 0xff, 0xff, 0x0f), ErrMalformed},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeKVEventBatch(c.in)
			require.ErrorIs(t, err, c.want)
		})
	}
	for n := 0; n < len(good); n++ {
		_, err := DecodeKVEventBatch(good[:n])
		require.ErrorIs(t, err, ErrMalformed, "truncated to %d bytes", n)
	}
}

func TestKVDumpChunkRoundTrips(t *testing.T) {
	for _, in := range []*KVDumpChunk{
		{Worker: "w-1", Instance: 7, AsOfID: 99, Seq: 3, Final: true, Hashes: []uint64{1, 2, 3}},
		{Worker: "w-1", Instance: 7, AsOfID: 0, Seq: 0, Hashes: []uint64{}},
	} {
		out, err := DecodeKVDumpChunk(AppendKVDumpChunk(nil, in))
		require.NoError(t, err)
		require.Equal(t, in, out)
	}
}

func TestDecodeKVDumpChunkRejectsBadInput(t *testing.T) {
	good := AppendKVDumpChunk(nil, &KVDumpChunk{Worker: "w", Final: true, Hashes: []uint64{5}})
	for n := 0; n < len(good); n++ {
		_, err := DecodeKVDumpChunk(good[:n])
		require.ErrorIs(t, err, ErrMalformed, "truncated to %d bytes", n)
	}
	bad := append([]byte(nil), good...)
	bad[3+1+1+8+8+4] = 2 // final flag
	_, err := DecodeKVDumpChunk(bad)
	require.ErrorIs(t, err, ErrMalformed)
	bad = append([]byte(nil), good...)
	bad[2] = 2
	_, err = DecodeKVDumpChunk(bad)
	require.ErrorIs(t, err, ErrVersion)
	_, err = DecodeKVDumpChunk(AppendKVDumpChunk(nil, &KVDumpChunk{Worker: ""}))
	require.ErrorIs(t, err, ErrMalformed)
}

func TestKVDumpRequestRoundTripsAndRejectsNegativeChunks(t *testing.T) {
	out, err := DecodeKVDumpRequest(EncodeKVDumpRequest(&KVDumpRequest{MaxBlocksPerChunk: 512}))
	require.NoError(t, err)
	require.Equal(t, &KVDumpRequest{Version: kvDumpVersion, MaxBlocksPerChunk: 512}, out)
	_, err = DecodeKVDumpRequest([]byte(`{"version":1,"max_blocks_per_chunk":-1}`))
	require.ErrorIs(t, err, ErrMalformed)
	_, err = DecodeKVDumpRequest([]byte(`{"version":2}`))
	require.ErrorIs(t, err, ErrVersion)
	_, err = DecodeKVDumpRequest([]byte(`[`))
	require.ErrorIs(t, err, ErrMalformed)
}

func TestLoadReportRoundTripsAndIsValidated(t *testing.T) {
	in := &LoadReport{Worker: "w", Instance: 3, Seq: 9, Running: 4, Waiting: 2, KVUsage: 0.5,
		KVBlocksUsed: 50, KVBlocksTotal: 100, PrefixHitRate: 0.25, LastEventID: 77, TimeUnixNano: 12}
	out, err := DecodeLoadReport(EncodeLoadReport(in))
	require.NoError(t, err)
	require.Equal(t, in, out)

	cases := map[string]string{
		"negative running": `{"version":1,"worker":"w","running":-1}`,
		"usage above one":  `{"version":1,"worker":"w","kv_usage":1.5}`,
		"hit rate above 1": `{"version":1,"worker":"w","prefix_hit_rate":2}`,
		"bad worker":       `{"version":1,"worker":"a b"}`,
		"not json":         `{"version":1,`,
	}
	for name, p := range cases {
		_, err := DecodeLoadReport([]byte(p))
		require.ErrorIs(t, err, ErrMalformed, name)
	}
	_, err = DecodeLoadReport([]byte(`{"version":2,"worker":"w"}`))
	require.ErrorIs(t, err, ErrVersion)
}

func TestEncodingALoadReportWithNaNReportsZeroInstead(t *testing.T) {
	out, err := DecodeLoadReport(EncodeLoadReport(&LoadReport{Worker: "w", KVUsage: math.NaN(), PrefixHitRate: math.Inf(1)}))
	require.NoError(t, err)
	require.Zero(t, out.KVUsage)
	require.Zero(t, out.PrefixHitRate)
}

func TestKVEventKindsHaveNames(t *testing.T) {
	require.Equal(t, "stored", KVStored.String())
	require.Equal(t, "removed", KVRemoved.String())
	require.Equal(t, "cleared", KVCleared.String())
	require.Equal(t, "kv_event_kind(0)", KVEventKind(0).String(), "kinds start at one; zero is never valid")
}

func FuzzDecodeKVEventBatch(f *testing.F) {
	f.Add(AppendKVEventBatch(nil, sampleBatch()))
	f.Add(AppendKVEventBatch(nil, &KVEventBatch{Worker: "w", FirstID: 1}))
	f.Add([]byte("SK\x02"))
	f.Add(AppendKVEventBatch(nil, &KVEventBatch{Worker: "w", FirstID: 1, Sample: 16}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeKVEventBatch(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		again, err := DecodeKVEventBatch(AppendKVEventBatch(nil, b))
		if err != nil {
			t.Fatalf("a decoded batch does not decode after re-encoding: %v", err)
		}
		if !reflect.DeepEqual(b, again) {
			t.Fatalf("round trip changed the batch:\n%+v\n%+v", b, again)
		}
	})
}

func FuzzDecodeKVDumpChunk(f *testing.F) {
	f.Add(AppendKVDumpChunk(nil, &KVDumpChunk{Worker: "w", Instance: 1, AsOfID: 2, Seq: 3, Final: true, Hashes: []uint64{4}}))
	f.Add([]byte("SD\x01"))
	f.Fuzz(func(t *testing.T, p []byte) {
		c, err := DecodeKVDumpChunk(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		again, err := DecodeKVDumpChunk(AppendKVDumpChunk(nil, c))
		if err != nil || !reflect.DeepEqual(c, again) {
			t.Fatalf("round trip failed: %v\n%+v\n%+v", err, c, again)
		}
	})
}

func FuzzDecodeKVDumpRequest(f *testing.F) {
	f.Add(EncodeKVDumpRequest(&KVDumpRequest{MaxBlocksPerChunk: 10}))
	f.Add([]byte(`{"version":1,"max_blocks_per_chunk":-5}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := DecodeKVDumpRequest(p)
		if err != nil {
			return
		}
		again, err := DecodeKVDumpRequest(EncodeKVDumpRequest(r))
		if err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("round trip failed: %v", err)
		}
	})
}

func FuzzDecodeLoadReport(f *testing.F) {
	f.Add(EncodeLoadReport(&LoadReport{Worker: "w", Running: 1, KVUsage: 0.3, PrefixHitRate: 0.9}))
	f.Add([]byte(`{"version":1,"worker":"w","kv_usage":-0}`))
	f.Add([]byte(`{"version":1,"worker":"w","kv_usage":1e400}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := DecodeLoadReport(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		again, err := DecodeLoadReport(EncodeLoadReport(r))
		if err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("round trip failed: %v\n%+v\n%+v", err, r, again)
		}
	})
}

func TestASampledBatchIsVersion3AndCarriesItsRate(t *testing.T) {
	b := &KVEventBatch{Worker: "w", Instance: 2, FirstID: 3, TimeUnixNano: 4, Sample: 32,
		Events: []KVEvent{{Kind: KVRemoved, Hashes: []uint64{6}}}}
	const want = "534b03" + "0177" + "0200000000000000" + "0300000000000000" + "0400000000000000" + "20" + "01" +
		"02" + "01" + "0600000000000000"
	p := AppendKVEventBatch(nil, b)
	require.Equal(t, want, hex.EncodeToString(p))
	out, err := DecodeKVEventBatch(p)
	require.NoError(t, err)
	require.Equal(t, b, out)

	for _, bad := range []string{"00", "01", "818008"} { // 0, 1 and 2^17: outside [2, 2^16]
		q, _ := hex.DecodeString("534b03" + "0177" + "0200000000000000" + "0300000000000000" + "0400000000000000" + bad + "00")
		_, err := DecodeKVEventBatch(q)
		require.ErrorIs(t, err, ErrMalformed, "sample %s", bad)
	}
}

func TestADecoderReusedAcrossBatchesDecodesEachAsAFreshOne(t *testing.T) {
	long := &KVEventBatch{Worker: "long", Instance: 1, FirstID: 1, Events: []KVEvent{
		{Kind: KVStored, Hashes: []uint64{1, 2, 3, 4, 5, 6, 7, 8}}, {Kind: KVRemoved, Hashes: []uint64{9, 10}}, {Kind: KVCleared}}}
	var d KVBatchDecoder
	for _, in := range []*KVEventBatch{long, sampleBatch(), long, {Worker: "w", FirstID: 8}} {
		out, err := d.Decode(AppendKVEventBatch(nil, in))
		require.NoError(t, err)
		require.Equal(t, in.Events == nil, len(out.Events) == 0)
		fresh, err := DecodeKVEventBatch(AppendKVEventBatch(nil, in))
		require.NoError(t, err)
		require.Equal(t, fresh, out)
	}
	last, err := d.Decode(AppendKVEventBatch(nil, long))
	require.NoError(t, err)
	kept := d.Take()
	require.Same(t, last, kept, "Take hands over the batch Decode returned")
	want := *kept
	want.Events = slices.Clone(kept.Events)
	_, err = d.Decode(AppendKVEventBatch(nil, sampleBatch()))
	require.NoError(t, err)
	require.Equal(t, &want, kept, "a taken batch is not overwritten by the next decode")
}

func FuzzKVBatchDecoderReuseMatchesAFreshDecode(f *testing.F) {
	f.Add(AppendKVEventBatch(nil, sampleBatch()), AppendKVEventBatch(nil, &KVEventBatch{Worker: "w", FirstID: 1, Sample: 4}))
	f.Add([]byte("SK\x03"), AppendKVEventBatch(nil, sampleBatch()))
	f.Fuzz(func(t *testing.T, p1, p2 []byte) {
		var d KVBatchDecoder
		_, _ = d.Decode(p1) // whatever it leaves behind must not show in the next
		got, err := d.Decode(p2)
		want, wantErr := DecodeKVEventBatch(p2)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("reused decoder error %v, fresh %v", err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !reflect.DeepEqual(normalized(want), normalized(got)) {
			t.Fatalf("reused decoder gave\n%+v\nfresh\n%+v", got, want)
		}
	})
}

// normalized treats empty and nil hash lists alike (an arena cut at zero
// length may be either).
func normalized(b *KVEventBatch) *KVEventBatch {
	c := *b
	c.Events = append([]KVEvent(nil), b.Events...)
	for i := range c.Events {
		if len(c.Events[i].Hashes) == 0 {
			c.Events[i].Hashes = nil
		}
	}
	if len(c.Events) == 0 {
		c.Events = nil
	}
	return &c
}
