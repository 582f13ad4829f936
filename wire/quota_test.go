package wire

import (
	"errors"
	"testing"
)

func FuzzDecodeQuotaLease(f *testing.F) {
	good, _ := EncodeQuota(&QuotaLease{Tenant: "acme", Home: "gold", Holder: "r1", Quota: QuotaLimits{Concurrent: 10}, Have: 2, Want: 1, ReturnTokens: -5})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = DecodeQuotaLease(b) })
}

func FuzzDecodeQuotaGrant(f *testing.F) {
	good, _ := EncodeQuota(&QuotaGrant{Owner: "r2", OK: true, Slots: 1, Tokens: 100})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = DecodeQuotaGrant(b) })
}

func FuzzDecodeQuotaRecall(f *testing.F) {
	good, _ := EncodeQuota(&QuotaRecall{Tenant: "acme", Owner: "r2"})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = DecodeQuotaRecall(b) })
}

func FuzzDecodeQuotaReturn(f *testing.F) {
	good, _ := EncodeQuota(&QuotaReturn{Holder: "r1", Have: 1, Tokens: -3})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = DecodeQuotaReturn(b) })
}

func TestQuotaMessagesRoundTripAndBadCountsAreMalformed(t *testing.T) {
	in := &QuotaLease{Tenant: "acme", Home: "gold", Holder: "r1", Quota: QuotaLimits{Concurrent: 10, TokensPerMinute: 1000}, Have: 2, Want: 1, WantTokens: 30, ReturnTokens: -5}
	b, err := EncodeQuota(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeQuotaLease(b)
	if err != nil || *out != *in {
		t.Fatalf("round trip: %+v, %v; want %+v", out, err, in)
	}
	for name, m := range map[string]*QuotaLease{
		"negative have":      {Tenant: "acme", Home: "gold", Holder: "r1", Have: -1},
		"negative quota":     {Tenant: "acme", Home: "gold", Holder: "r1", Quota: QuotaLimits{Concurrent: -1}},
		"huge tokens":        {Tenant: "acme", Home: "gold", Holder: "r1", WantTokens: MaxQuotaAmount + 1},
		"bad tenant":         {Tenant: "a.b", Home: "gold", Holder: "r1"},
		"negative requests":  {Tenant: "acme", Home: "gold", Holder: "r1", ReturnRequests: -1},
		"no home class":      {Tenant: "acme", Holder: "r1"},
		"huge returned debt": {Tenant: "acme", Home: "gold", Holder: "r1", ReturnTokens: -MaxQuotaAmount - 1},
	} {
		b, _ := EncodeQuota(m)
		if _, err := DecodeQuotaLease(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v; want ErrMalformed", name, err)
		}
	}
	b, _ = EncodeQuota(&QuotaGrant{Owner: "r2"})
	if _, err := DecodeQuotaGrant(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("a refusal without a limit: err = %v; want ErrMalformed", err)
	}
	if _, err := EncodeQuota(&AdmitReply{}); err == nil {
		t.Error("EncodeQuota took an admission message")
	}
}
