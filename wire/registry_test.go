package wire

import (
	"errors"
	"net"
	"os"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

func sampleWorkerInfo() *WorkerInfo {
	return &WorkerInfo{ID: "w-1", URL: "http://127.0.0.1:9001", Model: "m", BlockSize: 16, KVBlocks: 1024,
		MaxNumSeqs: 64, MaxBatchedTokens: 2048, Labels: map[string]string{"zone": "a"}, PublishesEvents: true}
}

func TestWorkerInfoRoundTripsWithItsVersionStamped(t *testing.T) {
	in := sampleWorkerInfo()
	b, err := EncodeWorkerInfo(in)
	require.NoError(t, err)
	require.Equal(t, RegistryVersion, in.Version)
	out, err := DecodeWorkerInfo(b)
	require.NoError(t, err)
	require.Equal(t, in, out)
}

func TestDecodeWorkerInfoRejectsUnusableRegistrations(t *testing.T) {
	cases := map[string]struct {
		json string
		want error
	}{
		"not json":         {`{`, ErrMalformed},
		"future version":   {`{"version":2,"id":"w","url":"u","block_size":1,"kv_blocks":1}`, ErrVersion},
		"bad id":           {`{"version":1,"id":"w/1","url":"u","block_size":1,"kv_blocks":1}`, ErrMalformed},
		"no url":           {`{"version":1,"id":"w","block_size":1,"kv_blocks":1}`, ErrMalformed},
		"zero block size":  {`{"version":1,"id":"w","url":"u","kv_blocks":1}`, ErrMalformed},
		"no kv blocks":     {`{"version":1,"id":"w","url":"u","block_size":16}`, ErrMalformed},
		"negative seqs":    {`{"version":1,"id":"w","url":"u","block_size":16,"kv_blocks":1,"max_num_seqs":-1}`, ErrMalformed},
		"string for a num": {`{"version":1,"id":"w","url":"u","block_size":"16","kv_blocks":1}`, ErrMalformed},
		"unknown role":     {`{"version":1,"id":"w","url":"u","block_size":16,"kv_blocks":1,"role":"encode","kv_transfer":"vllm"}`, ErrMalformed},
		"role no transfer": {`{"version":1,"id":"w","url":"u","block_size":16,"kv_blocks":1,"role":"prefill"}`, ErrMalformed},
		"unknown transfer": {`{"version":1,"id":"w","url":"u","block_size":16,"kv_blocks":1,"role":"decode","kv_transfer":"nixl"}`, ErrMalformed},
		"bootstrap port":   {`{"version":1,"id":"w","url":"u","block_size":16,"kv_blocks":1,"bootstrap_port":70000}`, ErrMalformed},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeWorkerInfo([]byte(c.json))
			require.ErrorIs(t, err, c.want)
		})
	}
}

func TestAWorkerWithoutARoleDoesBoth(t *testing.T) {
	w, err := DecodeWorkerInfo([]byte(`{"version":1,"id":"w","url":"u","block_size":16,"kv_blocks":1}`))
	require.NoError(t, err)
	require.Equal(t, RoleBoth, w.RoleOf())
	w, err = DecodeWorkerInfo([]byte(`{"version":1,"id":"w","url":"u","block_size":16,"kv_blocks":1,"role":"prefill","kv_transfer":"sglang","bootstrap_port":8998}`))
	require.NoError(t, err)
	require.Equal(t, RolePrefill, w.RoleOf())
	require.Equal(t, 8998, w.BootstrapPort)
}

func TestReplicaInfoRoundTripsAndRejectsBadIDs(t *testing.T) {
	in := &ReplicaInfo{ID: "r1", HTTPAddr: "127.0.0.1:8080", GossipAddr: "127.0.0.1:7946", Build: "dev", Ready: true}
	b, err := EncodeReplicaInfo(in)
	require.NoError(t, err)
	out, err := DecodeReplicaInfo(b)
	require.NoError(t, err)
	require.Equal(t, in, out)
	_, err = DecodeReplicaInfo([]byte(`{"version":1,"id":""}`))
	require.ErrorIs(t, err, ErrMalformed)
	_, err = DecodeReplicaInfo([]byte(`{"version":0,"id":"r"}`))
	require.ErrorIs(t, err, ErrVersion)
}

func FuzzDecodeWorkerInfo(f *testing.F) {
	good, _ := EncodeWorkerInfo(sampleWorkerInfo())
	f.Add(good)
	f.Add([]byte(`{"version":1,"id":"w","url":"u","block_size":1,"kv_blocks":1,"labels":null}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, p []byte) {
		w, err := DecodeWorkerInfo(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		b, err := EncodeWorkerInfo(w)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeWorkerInfo(b)
		if err != nil || !reflect.DeepEqual(w, again) {
			t.Fatalf("round trip failed: %v\n%+v\n%+v", err, w, again)
		}
	})
}

func FuzzDecodeReplicaInfo(f *testing.F) {
	good, _ := EncodeReplicaInfo(&ReplicaInfo{ID: "r", HTTPAddr: "h:1", Ready: true})
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := DecodeReplicaInfo(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		b, err := EncodeReplicaInfo(r)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeReplicaInfo(b)
		if err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("round trip failed: %v", err)
		}
	})
}

func TestAdvertiseURLIsTheBoundAddressOrTheHostNameForAnyInterface(t *testing.T) {
	require.Equal(t, "http://127.0.0.1:9001", AdvertiseURL(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9001}, false))
	require.Equal(t, "http://[::1]:9001", AdvertiseURL(&net.TCPAddr{IP: net.IPv6loopback, Port: 9001}, false))
	require.Equal(t, "https://127.0.0.1:9001", AdvertiseURL(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9001}, true),
		"a server serving TLS advertises https")
	host, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, "http://"+net.JoinHostPort(host, "9001"), AdvertiseURL(&net.TCPAddr{IP: net.IPv4zero, Port: 9001}, false),
		"a listener on every interface is reached by the machine's name")
}

func TestCheckAdvertiseURLWantsHTTPWithAHostAndHTTPSForATLSServer(t *testing.T) {
	for _, bad := range []string{"worker-1:9000", "tcp://worker-1:9000", "http://", "http://[::1"} {
		require.Errorf(t, CheckAdvertiseURL(bad, false), "%q", bad)
	}
	require.NoError(t, CheckAdvertiseURL("http://worker-1:9000", false))
	require.ErrorContains(t, CheckAdvertiseURL("http://worker-1:9000", true), "is not https://")
	require.NoError(t, CheckAdvertiseURL("https://worker-1:9000", true))
	require.NoError(t, CheckAdvertiseURL("https://worker-1:9000", false), "TLS may end in front of a plaintext server")
}
