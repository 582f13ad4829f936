package frontend

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// pythonReader is the reference reader: Python's json module, as the
// engines (vLLM, SGLang: Starlette's request.json()) read a body, in one
// long-lived python3 process that answers a line per body.
type pythonReader struct {
	mu  sync.Mutex
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// pythonReaderScript reads a hex-encoded body per line and prints what an
// engine would act on: each field tagged with its Python type, strings as
// the hex of their UTF-8 (lone surrogates kept, as Python keeps them).
const pythonReaderScript = `
import sys, json
def enc(v):
    if v is None: return ["null"]
    if isinstance(v, bool): return ["bool", v]
    if isinstance(v, int): return ["int", str(v)]
    if isinstance(v, float): return ["float", repr(v)]
    if isinstance(v, str): return ["str", v.encode("utf-8", "surrogatepass").hex()]
    return ["other", type(v).__name__]
for line in sys.stdin:
    try:
        d = json.loads(bytes.fromhex(line.strip()))
    except Exception as e:
        print(json.dumps({"ok": False, "err": type(e).__name__ + ": " + str(e)[:200]}), flush=True)
        continue
    if not isinstance(d, dict):
        print(json.dumps({"ok": False, "err": "not an object"}), flush=True)
        continue
    f = {}
    for k in ("model", "max_tokens", "max_completion_tokens", "stream", "n", "best_of"):
        f[k] = enc(d[k]) if k in d else ["absent"]
    so = d.get("stream_options")
    f["include_usage"] = enc(so["include_usage"]) if isinstance(so, dict) and "include_usage" in so else ["absent"]
    print(json.dumps({"ok": True, "f": f}), flush=True)
`

// pyValue is a tagged value: kind ("absent", "null", "bool", "int",
// "float", "str", "other") and its text.
type pyValue struct {
	kind, text string
}

func startPythonReader(tb testing.TB) *pythonReader {
	tb.Helper()
	// Debian's python3 is the reference (its json module is what the
	// engines' Python reads with); another python3 on PATH will do.
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		if py, err = exec.LookPath("python3"); err != nil {
			tb.Skip("python3 is not installed: the differential test against Python's json module needs it (apt-get install python3)")
		}
	}
	cmd := exec.Command(py, "-c", pythonReaderScript)
	in, err := cmd.StdinPipe()
	require.NoError(tb, err)
	out, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	require.NoError(tb, cmd.Start())
	r := &pythonReader{cmd: cmd, in: in, out: bufio.NewReader(out)}
	tb.Cleanup(func() {
		_ = in.Close() // the script ends at EOF
		_ = cmd.Wait()
	})
	return r
}

// read returns what Python reads in body (err != "": it refuses it).
func (r *pythonReader) read(tb testing.TB, body []byte) (map[string]pyValue, string) {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := fmt.Fprintf(r.in, "%s\n", hex.EncodeToString(body))
	require.NoError(tb, err)
	line, err := r.out.ReadBytes('\n')
	require.NoError(tb, err)
	var ans struct {
		OK  bool             `json:"ok"`
		Err string           `json:"err"`
		F   map[string][]any `json:"f"`
	}
	require.NoError(tb, json.Unmarshal(line, &ans), "%s", line)
	if !ans.OK {
		return nil, ans.Err
	}
	out := map[string]pyValue{}
	for k, tagged := range ans.F {
		require.NotEmpty(tb, tagged, "%s", line)
		pv := pyValue{kind: fmt.Sprint(tagged[0])}
		if len(tagged) > 1 {
			pv.text = fmt.Sprint(tagged[1])
		}
		out[k] = pv
	}
	return out, ""
}

// pyInt is v as an engine reads an optional integer: ok is false when it
// is not an integer at all (then the router must have refused the body).
func pyInt(v pyValue, absent int) (int, bool) {
	switch v.kind {
	case "absent", "null":
		return absent, true
	case "int":
		n, err := strconv.Atoi(v.text)
		return n, err == nil
	}
	return 0, false
}

// routerActsLikePython fails when parseRequest accepts body for ep and
// acts on a model, output bound, stream flag, sequence count or usage
// request (stream_options.include_usage) that differs from what Python's json reads in the same bytes.
func routerActsLikePython(t *testing.T, py *pythonReader, ep endpoint, body []byte) {
	p, apiErr := parseRequest(ep, body, nil)
	if apiErr != nil {
		return // refused: nothing reaches an engine
	}
	got, refused := py.read(t, body)
	if refused != "" {
		t.Fatalf("the router accepted %q, Python's json refuses it: %s", body, refused)
	}
	if m := got["model"]; m.kind != "str" || m.text != hex.EncodeToString([]byte(p.model)) {
		t.Fatalf("%q: the router acts on model %q, Python reads %v", body, p.model, m)
	}
	maxTok, ok := pyInt(got["max_tokens"], 0)
	if !ok {
		t.Fatalf("%q: the router accepted max_tokens %v", body, got["max_tokens"])
	}
	if ep == endpointChat {
		if mct, ok := pyInt(got["max_completion_tokens"], 0); !ok {
			t.Fatalf("%q: the router accepted max_completion_tokens %v", body, got["max_completion_tokens"])
		} else if got["max_completion_tokens"].kind == "int" {
			maxTok = mct
		}
	}
	if maxTok != p.maxTokens {
		t.Fatalf("%q: the router books %d output tokens, Python reads %d", body, p.maxTokens, maxTok)
	}
	stream := false
	switch s := got["stream"]; s.kind {
	case "absent", "null":
	case "bool":
		stream = s.text == "true"
	default:
		t.Fatalf("%q: the router accepted stream %v", body, s)
	}
	if stream != p.stream {
		t.Fatalf("%q: the router reads stream %v, Python %v", body, p.stream, stream)
	}
	n, okN := pyInt(got["n"], 1)
	bestOf, okB := pyInt(got["best_of"], 1)
	if !okN || !okB {
		t.Fatalf("%q: the router accepted n %v, best_of %v", body, got["n"], got["best_of"])
	}
	if want := max(n, bestOf, 1); want != p.sequences {
		t.Fatalf("%q: the router books %d sequences, Python reads %d", body, p.sequences, want)
	}
	// A stream's usage chunk is stripped exactly when the engine would not
	// have sent one to this client.
	if p.stream {
		asked := got["include_usage"].kind == "bool" && got["include_usage"].text == "true"
		if asked == p.injectedUsage {
			t.Fatalf("%q: the client asked for usage: %v (Python), the router injects it: %v", body, asked, p.injectedUsage)
		}
	}
	// What the router forwards (stream_options re-encoded, the switchyard
	// object stripped), the engine reads as the router acted on it.
	fwd, refused := py.read(t, p.forward)
	if refused != "" {
		t.Fatalf("the router forwards %q for %q, Python refuses it: %s", p.forward, body, refused)
	}
	for _, k := range []string{"model", "max_tokens", "max_completion_tokens", "stream", "n", "best_of"} {
		if fwd[k] != got[k] {
			t.Fatalf("%q forwarded as %q: Python reads %s %v, was %v", body, p.forward, k, fwd[k], got[k])
		}
	}
	if p.injectedUsage && (fwd["include_usage"].kind != "bool" || fwd["include_usage"].text != "true") {
		t.Fatalf("%q forwarded as %q: the engine is not asked for usage (%v)", body, p.forward, fwd["include_usage"])
	}
}

// keysSeeds are the tricky cases: case variants, repeats, escapes,
// non-ASCII folds, lone surrogates, numbers Python reads and Go does not.
var keysSeeds = []string{
	`{"model":"m","prompt":"hi"}`,
	`{"model":"other","MODEL":"m","prompt":"hi"}`,
	`{"MODEL":"m","prompt":"hi"}`,
	`{"model":"m","prompt":"hi","max_tokens":1,"max_tokens":5000}`,
	`{"model":"m","prompt":"hi","Max_Tokens":5000}`,
	`{"model":"m","prompt":"hi","stream":false,"Stream":true}`,
	`{"model":"m","prompt":"hi","ſtream":true}`,
	`{"model":"m","prompt":"hi","\u0073tream":true,"stream":false}`,
	`{"model":"m","prompt":"hi","n":1,"N":64}`,
	`{"model":"m","prompt":"hi","n":64,"best_of":128}`,
	`{"model":"m","prompt":"hi","n":0}`,
	`{"model":"m","prompt":"hi","n":1.0}`,
	`{"model":"m","prompt":"hi","max_tokens":NaN}`,
	`{"model":"m","prompt":"hi","max_tokens":Infinity}`,
	`{"model":"m","prompt":"hi","max_tokens":1e3}`,
	`{"model":"m","prompt":"hi","max_tokens":-0}`,
	`{"model":"m","prompt":"hi","max_tokens":99999999999999999999}`,
	`{"model":"\ud800","prompt":"hi"}`,
	`{"model":"\udc00\ud800","prompt":"hi"}`,
	`{"model":"\ud83d\ude00","prompt":"hi"}`,
	`{"model":"m\u0000","prompt":"hi"}`,
	"\xef\xbb\xbf{\"model\":\"m\",\"prompt\":\"hi\"}",
	"{\"model\":\"m\xff\",\"prompt\":\"hi\"}",
	`{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":false,"INCLUDE_USAGE":true}}`,
	`{"model":"m","prompt":"hi","switchyard":{"class":"a","Class":"b"}}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":5,"max_tokens":9}`,
	`{"model":"m","messages":[{"role":"user","content":"x","Content":"yyyyyyyy"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":null,"max_tokens":9}`,
	`{"model":"m","prompt":"hi","stream":null,"n":null,"best_of":null,"max_tokens":null}`,
	`{"model":"m","prompt":"hi","stream":true,"stream_options":{"continuous_usage_stats":true}}`,
	`{"model":"m","prompt":"hi","stream":true,"stream_\u006fptions":null,"switchyard":{"class":"a"}}`,
	` {} `,
	`{"stream":true,"model":"m","prompt":"<&>"}`,
}

// FuzzRouterActsOnWhatPythonReads feeds the same bytes to the router's
// decoder and to Python's json.loads (the engines' reader) and fails when
// the router accepts a body and acts on a value Python reads otherwise.
func FuzzRouterActsOnWhatPythonReads(f *testing.F) {
	for _, s := range keysSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	py := startPythonReader(f)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		ep := endpointCompletions
		if chat {
			ep = endpointChat
		}
		routerActsLikePython(t, py, ep, body)
	})
}
