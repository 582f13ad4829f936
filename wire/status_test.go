package wire

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAStatusProbeAndItsThreeAnswersRoundTrip(t *testing.T) {
	b, err := EncodeStatus(&StatusRequest{Class: "gold", ID: "r1", Attempt: 2, Entry: "e", Owner: "o"})
	require.NoError(t, err)
	req, err := DecodeStatusRequest(b)
	require.NoError(t, err)
	require.Equal(t, &StatusRequest{Version: admissionVersion, Class: "gold", ID: "r1", Attempt: 2, Entry: "e", Owner: "o"}, req)

	for _, st := range []AttemptStatus{StatusQueued, StatusUnknown} {
		b, err := EncodeStatus(&StatusReply{Owner: "o", Instance: 9, Status: st})
		require.NoError(t, err)
		rep, err := DecodeStatusReply(b)
		require.NoError(t, err)
		require.Equal(t, st, rep.Status)
		require.Nil(t, rep.Grant)
	}

	g := &AdmitReply{OK: true, Worker: "w", WorkerURL: "http://w", Booking: 7, Owner: "o", Epoch: 3, Instance: 9}
	b, err = EncodeStatus(&StatusReply{Owner: "o", Instance: 9, Status: StatusGranted, Grant: g})
	require.NoError(t, err)
	rep, err := DecodeStatusReply(b)
	require.NoError(t, err)
	require.Equal(t, StatusGranted, rep.Status)
	require.Equal(t, uint64(7), rep.Grant.Booking)
	require.Equal(t, int64(3), rep.Grant.Epoch)
	require.Equal(t, "http://w", rep.Grant.WorkerURL)
}

func TestABadStatusMessageIsATypedDecodeError(t *testing.T) {
	for name, raw := range map[string]string{
		"not json":               `{`,
		"version":                `{"v":2,"class":"c","id":"r","entry":"e","owner":"o"}`,
		"no id":                  `{"v":1,"class":"c","entry":"e","owner":"o"}`,
		"bad class":              `{"v":1,"class":"a.b","id":"r","entry":"e","owner":"o"}`,
		"negative attempt":       `{"v":1,"class":"c","id":"r","attempt":-1,"entry":"e","owner":"o"}`,
		"no owner":               `{"v":1,"class":"c","id":"r","entry":"e"}`,
		"subject wildcard entry": `{"v":1,"class":"c","id":"r","entry":"*","owner":"o"}`,
	} {
		_, err := DecodeStatusRequest([]byte(raw))
		require.Error(t, err, name)
		require.True(t, isTyped(err), "%s: %v", name, err)
	}
	for name, raw := range map[string]string{
		"not json":            `[]`,
		"unknown status":      `{"v":1,"owner":"o","status":"maybe"}`,
		"granted, no grant":   `{"v":1,"owner":"o","status":"granted"}`,
		"granted, a refusal":  `{"v":1,"owner":"o","status":"granted","grant":{"v":1,"reason":"queue_full"}}`,
		"granted, no booking": `{"v":1,"owner":"o","status":"granted","grant":{"v":1,"ok":true,"worker":"w","owner":"o"}}`,
		"another owner":       `{"v":1,"owner":"o","status":"granted","grant":{"v":1,"ok":true,"worker":"w","booking":1,"owner":"p"}}`,
		"queued with a grant": `{"v":1,"owner":"o","status":"queued","grant":{"v":1,"ok":true,"worker":"w","booking":1,"owner":"o"}}`,
		"no owner":            `{"v":1,"status":"unknown"}`,
	} {
		_, err := DecodeStatusReply([]byte(raw))
		require.Error(t, err, name)
		require.True(t, isTyped(err), "%s: %v", name, err)
	}
}

func FuzzDecodeStatusRequest(f *testing.F) {
	good, _ := EncodeStatus(&StatusRequest{Class: "c", ID: "r", Attempt: 1, Entry: "e", Owner: "o"})
	f.Add(good)
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeStatusRequest(b)
		if err != nil {
			require.True(t, isTyped(err), "untyped decode error: %v", err)
			return
		}
		again, err := EncodeStatus(m)
		require.NoError(t, err)
		_, err = DecodeStatusRequest(again)
		require.NoError(t, err, "a decoded status request does not decode again")
	})
}

func FuzzDecodeStatusReply(f *testing.F) {
	for _, m := range []*StatusReply{
		{Owner: "o", Status: StatusQueued},
		{Owner: "o", Status: StatusUnknown, Instance: 3},
		{Owner: "o", Instance: 3, Status: StatusGranted, Grant: &AdmitReply{OK: true, Worker: "w", Booking: 1, Owner: "o", Instance: 3, Epoch: 2,
			Candidates: []Candidate{{Worker: "v", CachedTokens: 16}}}},
	} {
		b, _ := EncodeStatus(m)
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"owner":"o","status":"granted","grant":{"v":1,"ok":true,"worker":"w","booking":1,"owner":"o","tier":-1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeStatusReply(b)
		if err != nil {
			require.True(t, isTyped(err), "untyped decode error: %v", err)
			return
		}
		if (m.Status == StatusGranted) != (m.Grant != nil) {
			t.Fatalf("status %s decoded with grant %+v", m.Status, m.Grant)
		}
		if g := m.Grant; g != nil && (!g.OK || g.Booking == 0 || g.Worker == "" || g.TierCredit < 0 || g.Owner != m.Owner) {
			t.Fatalf("a bad grant decoded: %+v", g)
		}
		again, err := EncodeStatus(m)
		require.NoError(t, err)
		_, err = DecodeStatusReply(again)
		require.NoError(t, err, "a decoded status reply does not decode again")
	})
}

// isTyped reports whether err is one of the package's decode errors.
func isTyped(err error) bool { return errors.Is(err, ErrMalformed) || errors.Is(err, ErrVersion) }
