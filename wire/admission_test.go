package wire

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAdmitRequestRoundTrips(t *testing.T) {
	in := &AdmitRequest{ID: "r1", Class: "gold", Entry: "replica-1", Attempt: 2, StrictPriority: 1,
		PriorityJump: 0.5, IngressUnixNano: 10, DueUnixNano: 20, PromptTokens: 100,
		BlockHashes: []uint64{1, 1 << 63}, Overlaps: []AdmitOverlap{{Worker: "w1", Blocks: 2}},
		Pinned: "w1", Allowed: []string{"w1", "w2"}, ExpectedOutput: 5, SizedBlocks: []AdmitBlocks{{BlockSize: 16, Hashes: []uint64{9}}},
		Tenant: "acme", TenantWeight: 3, TenantQuota: &AdmitQuota{Concurrent: 10, RequestsPerMinute: 60, TokensPerMinute: 1000},
		Session: &AdmitSession{Worker: "w2", Hard: true, MarginRatio: 0.5, MarginCost: 20}}
	b, err := EncodeAdmission(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeAdmitRequest(b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip changed the message:\n in=%+v\nout=%+v", in, out)
	}
}

func TestAdmissionDecodersRejectBadInputWithTypedErrors(t *testing.T) {
	cases := map[string]struct {
		decode func([]byte) error
		input  string
		want   error
	}{
		"admit: not json":          {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{`, ErrMalformed},
		"admit: future version":    {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":9,"id":"a","class":"c","entry":"e"}`, ErrVersion},
		"admit: sized w/o size":    {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","ingress":1,"sized":[{"bs":0,"blocks":[1]}]}`, ErrMalformed},
		"admit: bad class":         {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"a.b","entry":"e"}`, ErrMalformed},
		"admit: negative due":      {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","due":-1}`, ErrMalformed},
		"reply: grant w/o booking": {func(b []byte) error { _, err := DecodeAdmitReply(b); return err }, `{"v":1,"ok":true,"worker":"w"}`, ErrMalformed},
		"reply: reject w/o reason": {func(b []byte) error { _, err := DecodeAdmitReply(b); return err }, `{"v":1,"ok":false}`, ErrMalformed},
		"life: unknown kind":       {func(b []byte) error { _, err := DecodeLifeMark(b); return err }, `{"v":1,"kind":"exploded"}`, ErrMalformed},
		"cancel: no id":            {func(b []byte) error { _, err := DecodeCancelRequest(b); return err }, `{"v":1}`, ErrMalformed},
		"adopt: bad booking":       {func(b []byte) error { _, err := DecodeAdoptRequest(b); return err }, `{"v":1,"class":"c","entry":"e","bookings":[{"worker":""}]}`, ErrMalformed},
		"admit: bad tenant":        {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","ingress":1,"tenant":"a b"}`, ErrMalformed},
		"admit: weight w/o tenant": {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","ingress":1,"tw":3}`, ErrMalformed},
		"admit: huge weight":       {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","ingress":1,"tenant":"t","tw":1001}`, ErrMalformed},
		"admit: negative quota":    {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","ingress":1,"tenant":"t","tq":{"tpm":-1}}`, ErrMalformed},
		"reply: negative retry":    {func(b []byte) error { _, err := DecodeAdmitReply(b); return err }, `{"v":1,"ok":false,"reason":"quota_exceeded","retry_ms":-5}`, ErrMalformed},
		"life: usage on renew":     {func(b []byte) error { _, err := DecodeLifeMark(b); return err }, `{"v":1,"kind":"renew","bookings":[1],"used":[{"b":1,"t":5}]}`, ErrMalformed},
		"life: negative usage":     {func(b []byte) error { _, err := DecodeLifeMark(b); return err }, `{"v":1,"kind":"done","bookings":[1],"used":[{"b":1,"t":-5}]}`, ErrMalformed},
		"life: usage of more":      {func(b []byte) error { _, err := DecodeLifeMark(b); return err }, `{"v":1,"kind":"done","bookings":[],"used":[{"b":1,"t":5}]}`, ErrMalformed},
		"reply: nameless cand":     {func(b []byte) error { _, err := DecodeAdmitReply(b); return err }, `{"v":1,"ok":true,"worker":"w","booking":1,"cands":[{"cached":16}]}`, ErrMalformed},
		"reply: negative cand":     {func(b []byte) error { _, err := DecodeAdmitReply(b); return err }, `{"v":1,"ok":true,"worker":"w","booking":1,"cands":[{"w":"w","ttft":-1}]}`, ErrMalformed},
		"reply: many cands":        {func(b []byte) error { _, err := DecodeAdmitReply(b); return err }, `{"v":1,"ok":true,"worker":"w","booking":1,"cands":[{"w":"a"},{"w":"a"},{"w":"a"},{"w":"a"},{"w":"a"},{"w":"a"},{"w":"a"},{"w":"a"},{"w":"a"}]}`, ErrMalformed},
		"admit: nameless session":  {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","ingress":1,"sess":{"mr":1}}`, ErrMalformed},
		"admit: negative margin":   {func(b []byte) error { _, err := DecodeAdmitRequest(b); return err }, `{"v":1,"id":"a","class":"c","entry":"e","ingress":1,"sess":{"w":"w","mc":-1}}`, ErrMalformed},
		"adopt: bad tenant":        {func(b []byte) error { _, err := DecodeAdoptRequest(b); return err }, `{"v":1,"class":"c","entry":"e","bookings":[{"worker":"w","tenant":"x.y"}]}`, ErrMalformed},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if err := c.decode([]byte(c.input)); !errors.Is(err, c.want) {
				t.Fatalf("err = %v; want %v", err, c.want)
			}
		})
	}
}

func FuzzDecodeAdmitRequest(f *testing.F) {
	good, _ := EncodeAdmission(&AdmitRequest{ID: "r", Class: "c", Entry: "e", IngressUnixNano: 1, PromptTokens: 3, BlockHashes: []uint64{7}})
	f.Add(good)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`null`))
	tenant, _ := EncodeAdmission(&AdmitRequest{ID: "r", Class: "c", Entry: "e", IngressUnixNano: 1, Tenant: "acme", TenantWeight: 3,
		TenantQuota: &AdmitQuota{Concurrent: 10, RequestsPerMinute: 5, TokensPerMinute: 100}})
	f.Add(tenant)
	sess, _ := EncodeAdmission(&AdmitRequest{ID: "r", Class: "c", Entry: "e", IngressUnixNano: 1, Session: &AdmitSession{Worker: "w", MarginRatio: 0.5}})
	f.Add(sess)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeAdmitRequest(b)
		if err != nil {
			return
		}
		again, err := EncodeAdmission(m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := DecodeAdmitRequest(again); err != nil {
			t.Fatalf("a decoded message does not decode again: %v", err)
		}
	})
}

func FuzzDecodeAdmitReply(f *testing.F) {
	good, _ := EncodeAdmission(&AdmitReply{OK: true, Worker: "w", Booking: 1, Owner: "o", Epoch: 3})
	f.Add(good)
	f.Add([]byte(`{"v":1,"ok":false,"reason":"queue_full"}`))
	f.Add([]byte(`{"v":1,"ok":false,"reason":"quota_exceeded","limit":"concurrent","retry_ms":1500}`))
	cands, _ := EncodeAdmission(&AdmitReply{OK: true, Worker: "w", Booking: 1, Owner: "o", Epoch: 3,
		Candidates: []Candidate{{Worker: "w", PredictedTTFTNano: 5e6}, {Worker: "v", CachedTokens: 64, PredictedTTFTNano: 2e6}}})
	f.Add(cands)
	pair, _ := EncodeAdmission(&AdmitReply{OK: true, Worker: "p", Booking: 1, Owner: "o", Epoch: 3, Decision: "long_prefill",
		Decode: &AdmitDecode{Worker: "d", URL: "http://d", BlockSize: 16, Booking: 2, TransferNano: 7e6}})
	f.Add(pair)
	f.Add([]byte(`{"v":1,"ok":true,"worker":"p","booking":1,"decode":{"worker":""}}`))
	f.Add([]byte(`{"v":1,"ok":true,"worker":"w","booking":1,"cached":64,"tier":-5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeAdmitReply(b)
		if err == nil && m.TierCredit < 0 {
			t.Fatalf("a negative tier credit decoded: %+v", m)
		}
		if err == nil && m.Decode != nil && (m.Decode.Worker == "" || !m.OK || m.Decode.TransferNano < 0) {
			t.Fatalf("a bad decode worker decoded: %+v", m.Decode)
		}
		if err != nil {
			return
		}
		again, err := EncodeAdmission(m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := DecodeAdmitReply(again); err != nil {
			t.Fatalf("a decoded reply does not decode again: %v", err)
		}
	})
}

func FuzzDecodeLifeMark(f *testing.F) {
	good, _ := EncodeAdmission(&LifeMark{Entry: "e", Kind: LifeDone, Bookings: []uint64{1, 2}})
	f.Add(good)
	used, _ := EncodeAdmission(&LifeMark{Entry: "e", Kind: LifeDone, Bookings: []uint64{1, 2}, Used: []LifeUsage{{Booking: 2, Tokens: 40}}})
	f.Add(used)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeLifeMark(b)
		if err != nil {
			return
		}
		for _, u := range m.Used {
			if u.Tokens < 0 || m.Kind != LifeDone {
				t.Fatalf("decoded usage %+v on a %s mark", u, m.Kind)
			}
		}
	})
}

func FuzzDecodeCancelRequest(f *testing.F) {
	good, _ := EncodeAdmission(&CancelRequest{ID: "r", Entry: "e"})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = DecodeCancelRequest(b) })
}

func FuzzDecodeAdoptRequest(f *testing.F) {
	good, _ := EncodeAdmission(&AdoptRequest{Entry: "e", Class: "c", Bookings: []AdoptedBooking{{RequestID: "r", Worker: "w", PromptTokens: 3, Tenant: "acme"}}})
	f.Add(good)
	done, _ := EncodeAdmission(&AdoptRequest{Entry: "e", Class: "c", Bookings: []AdoptedBooking{}, Epoch: 7, Done: true})
	f.Add(done)
	f.Add([]byte(`{"v":1,"entry":"e","class":"c","bookings":null,"done":true}`))
	f.Add([]byte(`{"v":1,"entry":"e","class":"c","epoch":-3}`))
	pair, _ := EncodeAdmission(&AdoptRequest{Entry: "e", Class: "c", Bookings: []AdoptedBooking{{RequestID: "r", Worker: "p", PromptTokens: 3,
		Decode: &AdoptedDecode{Worker: "d", BlockHashes: []uint64{9}}}}})
	f.Add(pair)
	f.Add([]byte(`{"v":1,"entry":"e","class":"c","bookings":[{"id":"r","worker":"w","isl":9,"tier":-1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeAdoptRequest(b)
		if err != nil {
			return
		}
		for _, x := range m.Bookings {
			if x.TierCredit < 0 {
				t.Fatalf("a negative tier credit decoded: %+v", x)
			}
		}
		if m.Epoch < 0 || (m.Done && m.Epoch == 0) {
			t.Fatalf("decoded a done report without a valid epoch: %+v", m)
		}
		again, err := EncodeAdmission(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeAdoptRequest(again); err != nil {
			t.Fatalf("a decoded adopt request does not decode again: %v", err)
		}
	})
}

// A done report (a re-home round's end, possibly with no bookings) is an
// adopt request with two optional fields: an owner that predates them
// reads it as an adopt of its bookings, and one without them is still
// valid. A done report must name the epoch it completes.
func TestAnAdoptRequestCarriesAnOptionalDoneReport(t *testing.T) {
	b, err := EncodeAdmission(&AdoptRequest{Entry: "e", Class: "c", Epoch: 7, Done: true})
	require.NoError(t, err)
	m, err := DecodeAdoptRequest(b)
	require.NoError(t, err)
	require.True(t, m.Done)
	require.EqualValues(t, 7, m.Epoch)
	require.Empty(t, m.Bookings)

	var old struct { // the fields an older owner knows
		Version  int              `json:"v"`
		Entry    string           `json:"entry"`
		Class    string           `json:"class"`
		Bookings []AdoptedBooking `json:"bookings"`
	}
	require.NoError(t, json.Unmarshal(b, &old), "an older owner decodes it")
	require.Equal(t, admissionVersion, old.Version, "same protocol version")

	m, err = DecodeAdoptRequest([]byte(`{"v":1,"entry":"e","class":"c","bookings":[]}`))
	require.NoError(t, err, "an older entry's adopt request")
	require.False(t, m.Done)

	for _, bad := range []string{
		`{"v":1,"entry":"e","class":"c","done":true}`,
		`{"v":1,"entry":"e","class":"c","epoch":-1}`,
	} {
		_, err := DecodeAdoptRequest([]byte(bad))
		require.ErrorIs(t, err, ErrMalformed, bad)
	}
}

func FuzzDecodeAdoptReply(f *testing.F) {
	good, _ := EncodeAdmission(&AdoptReply{Owner: "o", Epoch: 1, Bookings: []uint64{4}})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = DecodeAdoptReply(b) })
}

func TestAnAdmitRequestWithoutAPositiveIngressTimeIsMalformed(t *testing.T) {
	for _, ingress := range []int64{0, -1, -1 << 62} {
		b, err := EncodeAdmission(&AdmitRequest{ID: "r", Class: "c", Entry: "e", IngressUnixNano: ingress})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeAdmitRequest(b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("ingress %d: err = %v; want ErrMalformed (such a request would jump the FCFS queue)", ingress, err)
		}
	}
}

func TestAnAdmitRequestFromTooFarInTheFutureIsMalformed(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &AdmitRequest{ID: "r", Class: "c", Entry: "e", IngressUnixNano: now.Add(MaxIngressAhead + time.Nanosecond).UnixNano()}
	if err := m.CheckIngress(now); !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v; want ErrMalformed", err)
	}
	m.IngressUnixNano = now.Add(MaxIngressAhead).UnixNano()
	if err := m.CheckIngress(now); err != nil {
		t.Fatalf("an ingress within the skew bound is fine: %v", err)
	}
}

// A lower-tier credit travels with a grant and with a re-homed booking, so
// the new owner books the same prefill load; a negative one is refused.
func TestTheTierCreditTravelsWithAGrantAndARehomedBooking(t *testing.T) {
	b, err := EncodeAdmission(&AdmitReply{OK: true, Worker: "w", Booking: 1, CachedTokens: 1024, TierCredit: 2000})
	require.NoError(t, err)
	reply, err := DecodeAdmitReply(b)
	require.NoError(t, err)
	require.Equal(t, 2000, reply.TierCredit)
	b, err = EncodeAdmission(&AdoptRequest{Entry: "e", Class: "c", Bookings: []AdoptedBooking{{RequestID: "r", Worker: "w", PromptTokens: 4096, CachedTokens: 1024, TierCredit: 2000}}})
	require.NoError(t, err)
	adopt, err := DecodeAdoptRequest(b)
	require.NoError(t, err)
	require.Equal(t, 2000, adopt.Bookings[0].TierCredit)
	_, err = DecodeAdmitReply([]byte(`{"v":1,"ok":true,"worker":"w","booking":1,"tier":-5}`))
	require.ErrorIs(t, err, ErrMalformed)
	_, err = DecodeAdoptRequest([]byte(`{"v":1,"entry":"e","class":"c","bookings":[{"id":"r","worker":"w","isl":9,"tier":-1}]}`))
	require.ErrorIs(t, err, ErrMalformed)
}
