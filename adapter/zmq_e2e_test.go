// These tests drive the adapter through real ZeroMQ sockets: a Python
// publisher (Debian's python3-zmq and python3-msgpack) speaks vLLM's and
// SGLang's event protocol, and the real enginekv subscriber feeds the
// mirror.
package adapter

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/testenv"
)

// publisherPy binds a PUB socket and a replay ROUTER, keeps every batch it
// was given, and obeys one command per stdin line:
//
//	add <json batch>   buffer a batch (its seq is the buffer index + base)
//	pub <seq>          send buffered batch seq on the PUB socket
//	restart            forget the buffer and start again from seq 0
//	waitsub            wait until a subscriber has subscribed
//
// The socket is an XPUB, wire-compatible with vLLM's PUB, so that waitsub
// can see the adapter's subscription arrive: a PUB drops what it sends
// before that (ZeroMQ's slow joiner), and a batch lost with nothing after
// it is a loss no subscriber can notice.
//
// Replay requests [identity, "", start u64 BE] are answered per batch from
// start with [identity, "", topic, seq, payload] and closed with seq -1.
// Hashes in the json are emitted as given (ints, negative ints for SGLang,
// or {"bytes": hex} for vLLM's bytes hashes).
const publisherPy = `
import sys, json, time, threading, zmq, msgpack
pub_ep, replay_ep, topic = sys.argv[1], sys.argv[2], sys.argv[3].encode()
ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB); pub.bind(pub_ep)
rtr = ctx.socket(zmq.ROUTER); rtr.bind(replay_ep)
lock = threading.Lock()
buf = []
def conv(v):
    if isinstance(v, dict) and "bytes" in v: return bytes.fromhex(v["bytes"])
    if isinstance(v, list): return [conv(x) for x in v]
    if isinstance(v, dict): return {k: conv(x) for k, x in v.items()}
    return v
def payload(b):
    return msgpack.packb([b.get("ts", time.time()), conv(b["events"]), b.get("dp_rank", 0)], use_bin_type=True)
def replay():
    while True:
        ident, empty, start = rtr.recv_multipart()
        s = int.from_bytes(start, "big")
        with lock:
            items = list(enumerate(buf))[s:]
        for seq, p in items:
            rtr.send_multipart([ident, b"", topic, seq.to_bytes(8, "big"), p])
        rtr.send_multipart([ident, b"", topic, (-1).to_bytes(8, "big", signed=True), b""])
threading.Thread(target=replay, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "add":
        with lock: buf.append(payload(json.loads(arg)))
    elif cmd == "pub":
        seq = int(arg)
        with lock: p = buf[seq]
        pub.send_multipart([topic, seq.to_bytes(8, "big"), p])
    elif cmd == "restart":
        with lock: buf.clear()
    elif cmd == "waitsub":
        pub.recv()
    print("ok", flush=True)
`

type pyPublisher struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	pubEP  string
	replay string
}

func startPublisher(t *testing.T) *pyPublisher {
	t.Helper()
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skip("needs /usr/bin/python3 with python3-zmq and python3-msgpack (Debian packages): " + err.Error())
	}
	script := filepath.Join(t.TempDir(), "publisher.py")
	require.NoError(t, os.WriteFile(script, []byte(publisherPy), 0o600))
	p := &pyPublisher{pubEP: fmt.Sprintf("tcp://127.0.0.1:%d", testenv.FreePort(t)),
		replay: fmt.Sprintf("tcp://127.0.0.1:%d", testenv.FreePort(t))}
	p.cmd = exec.Command(py, script, p.pubEP, p.replay, "kv")
	p.cmd.Stderr = os.Stderr
	var err error
	p.in, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() { _ = p.in.Close(); _ = p.cmd.Wait() })
	p.out = bufio.NewScanner(stdout)
	p.out.Buffer(make([]byte, 1<<20), 1<<20)
	require.True(t, p.out.Scan(), "publisher did not start")
	require.Equal(t, "ready", p.out.Text())
	return p
}

func (p *pyPublisher) do(t *testing.T, line string) {
	t.Helper()
	_, err := fmt.Fprintln(p.in, line)
	require.NoError(t, err)
	require.True(t, p.out.Scan(), "publisher died")
	require.Equal(t, "ok", p.out.Text())
}

// vllmArrayStored is a BlockStored event in vLLM's tagged-array encoding.
func vllmArrayStored(e enginekv.Event) []any {
	var parent any
	if e.HasParent {
		parent = e.ParentHash
	}
	var lora any
	if e.LoRAName != "" {
		lora = e.LoRAName
	}
	return []any{"BlockStored", e.BlockHashes, parent, e.TokenIDs, e.BlockSize, nil, "GPU", lora}
}

func (p *pyPublisher) add(t *testing.T, events ...any) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"events": events})
	require.NoError(t, err)
	p.do(t, "add "+string(b))
}

func zmqAdapter(t *testing.T, p *pyPublisher) (*runningAdapter, *routerIndex) {
	t.Helper()
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.KVEvents, cfg.KVReplay, cfg.KVTopic = p.pubEP, p.replay, "kv"
	router := startRouterIndex(t, n, "w1", 2048)
	reg := startAdapterReal(t, cfg, etcd, n)
	testenv.Eventually(t, 10*time.Second, func() bool { return reg.a.ready() == "" }, "adapter ready")
	p.do(t, "waitsub")
	return reg, router
}

// startAdapterReal runs the adapter with its real enginekv subscriber.
func startAdapterReal(t *testing.T, cfg Config, etcd *testenv.Etcd, n *testenv.NATS) *runningAdapter {
	t.Helper()
	return startAdapterWith(t, cfg, etcd, n, nil)
}

func TestOverZMQAMidStreamJoinReplaysFromTheStartAndAGapIsReplayed(t *testing.T) {
	p := startPublisher(t)
	a := newPrompt(1, 4, testBS)
	c := newPrompt(2, 2, testBS)
	d := newPrompt(3, 3, testBS)
	p.add(t, vllmArrayStored(a.stored(0, 2)))
	p.add(t, vllmArrayStored(a.stored(2, 4)))
	p.do(t, "pub 0")
	p.do(t, "pub 1") // before the adapter exists: only the replay has them
	_, router := zmqAdapter(t, p)
	p.add(t, vllmArrayStored(c.stored(0, 2)))
	p.add(t, vllmArrayStored(d.stored(0, 3)))
	p.do(t, "pub 3") // 2 is never published live: a gap the replay fills
	router.holdsExactly(t, "w1", slices.Concat(a.want(testSalt, 4), c.want(testSalt, 2), d.want(testSalt, 3)), "join and gap replayed")
}

func TestOverZMQAnEngineRestartResetsTheRoutersIndexAndItRefills(t *testing.T) {
	p := startPublisher(t)
	_, router := zmqAdapter(t, p)
	a := newPrompt(1, 3, testBS)
	p.add(t, vllmArrayStored(a.stored(0, 3)))
	p.add(t, map[string]any{"type": "BlockRemoved", "block_hashes": a.engine[2:3], "medium": "GPU"})
	p.do(t, "pub 0")
	p.do(t, "pub 1")
	router.holdsExactly(t, "w1", a.want(testSalt, 2), "before the restart")
	p.do(t, "restart") // the engine restarts: sequence 0 again, empty cache
	c := newPrompt(2, 2, testBS)
	p.add(t, vllmArrayStored(c.stored(0, 2)))
	p.do(t, "pub 0")
	router.holdsExactly(t, "w1", c.want(testSalt, 2), "no stale hit of the old engine's blocks")
}

func TestOverZMQSGLangMapEventsWithSignedHashesAreMirrored(t *testing.T) {
	p := startPublisher(t)
	_, router := zmqAdapter(t, p)
	a := newPrompt(1, 3, testBS)
	signed := make([]int64, len(a.engine))
	for i, h := range a.engine {
		signed[i] = -int64(h >> 1) // SGLang's hashes are signed 64-bit
	}
	ev := map[string]any{"type": "BlockStored", "block_hashes": signed[:1], "parent_block_hash": nil,
		"token_ids": a.tokens[:testBS], "block_size": testBS, "lora_id": nil, "medium": "GPU"}
	ev2 := map[string]any{"type": "BlockStored", "block_hashes": signed[1:], "parent_block_hash": signed[0],
		"token_ids": a.tokens[testBS:], "block_size": testBS, "lora_id": nil, "medium": "GPU"}
	p.add(t, ev)
	p.add(t, ev2)
	p.do(t, "pub 0")
	p.do(t, "pub 1")
	router.holdsExactly(t, "w1", a.want(testSalt, 3), "SGLang-style events")
}

func TestOverZMQAChainStartMarkedWithParentZeroIsMirroredNotSkipped(t *testing.T) {
	p := startPublisher(t)
	reg, router := zmqAdapter(t, p)
	a := newPrompt(1, 3, testBS)
	first := a.stored(0, 2)
	first.ParentHash, first.HasParent = 0, true // the publisher's "no parent"
	ev := map[string]any{"type": "BlockStored", "block_hashes": first.BlockHashes, "parent_block_hash": 0,
		"token_ids": first.TokenIDs, "block_size": testBS, "lora_id": nil, "medium": "GPU"}
	p.add(t, ev)
	p.add(t, vllmArrayStored(a.stored(2, 3)))
	p.do(t, "pub 0")
	p.do(t, "pub 1")
	router.holdsExactly(t, "w1", a.want(testSalt, 3), "a chain started with parent 0, and its child")
	m := reg.a.mirror.m
	require.Zero(t, testutil.ToFloat64(m.skipped[skipUnknownParent]), "nothing skipped as unknown_parent")
	require.Equal(t, 2.0, testutil.ToFloat64(m.zeroParents), "the two blocks whose parent read 0 are counted")
}
