package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsChildEnv marks a test binary re-executed by StartNATSProcess: its
// TestMain calls RunNATSChildIfAsked, which runs only the NATS server.
const natsChildEnv = "SWITCHYARD_TESTENV_NATS_CHILD"

// RunNATSChildIfAsked makes a test binary usable as StartNATSProcess's
// server. Call it first in TestMain: in the child StartNATSProcess starts it
// serves NATS on loopback until its stdin closes, then exits the process
// without running any test; otherwise it returns at once.
//
// The child speaks a line protocol on its pipes: it writes its client URL
// once it is ready; for every "stats" line read it writes one JSON
// NATSProcessStats line; at end of input it shuts the server down. A parent
// that dies closes the pipe, so the child never outlives it.
func RunNATSChildIfAsked() {
	if os.Getenv(natsChildEnv) != "1" {
		return
	}
	if err := runNATSChild(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testenv nats child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runNATSChild(in io.Reader, out io.Writer) error {
	s, err := newNATSServer(natsserver.RANDOM_PORT)
	if err != nil {
		return err
	}
	defer func() {
		s.Shutdown()
		s.WaitForShutdown()
	}()
	if _, err := fmt.Fprintln(out, s.ClientURL()); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "stats" {
			return fmt.Errorf("unknown request %q", sc.Text())
		}
		v, err := s.Varz(nil)
		if err != nil {
			return fmt.Errorf("varz: %w", err)
		}
		line, err := json.Marshal(NATSProcessStats{InMsgs: v.InMsgs, InBytes: v.InBytes, CPU: ProcessCPU()})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "%s\n", line); err != nil {
			return err
		}
	}
	return sc.Err()
}

// NATSProcess is a NATS server running in a child process: the test binary
// itself, re-executed (see RunNATSChildIfAsked). A benchmark that reports
// work per CPU-second of its own process then counts only the client's
// side of NATS, as in production, where the server is another process; the
// server's CPU time is asked for separately (Stats).
type NATSProcess struct {
	URL string

	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// NATSProcessStats is what the child server reports.
type NATSProcessStats struct {
	// InMsgs and InBytes are the messages and payload bytes the server
	// received from its clients.
	InMsgs  int64 `json:"in_msgs"`
	InBytes int64 `json:"in_bytes"`
	// CPU is the child process's user+system CPU time (0 where
	// ProcessCPU is unavailable).
	CPU time.Duration `json:"cpu_ns"`
}

// StartNATSProcess starts a NATS server on 127.0.0.1 with a random port in
// a child process, the test binary re-executed; its TestMain must call
// RunNATSChildIfAsked first. The child is stopped (its stdin closed, then
// waited for) when the test ends.
func StartNATSProcess(t testing.TB) *NATSProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("nats child: find the test binary: %v", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), natsChildEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("nats child: stdin: %v", err)
	}
	outR, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("nats child: stdout: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("nats child: start %s: %v", exe, err)
	}
	p := &NATSProcess{cmd: cmd, in: in, out: bufio.NewScanner(outR)}
	t.Cleanup(func() {
		_ = p.in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("nats child: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("nats child did not stop within 10s of its stdin closing; killed: %v", <-done)
		}
	})
	if !p.out.Scan() {
		t.Fatalf("nats child exited before it was ready: %v", p.out.Err())
	}
	p.URL = strings.TrimSpace(p.out.Text())
	if !strings.HasPrefix(p.URL, "nats://") {
		t.Fatalf("nats child: got %q, want its client URL", p.URL)
	}
	return p
}

// Conn returns a client connection to the server, closed when the test ends.
func (p *NATSProcess) Conn(t testing.TB) *nats.Conn {
	t.Helper()
	return connectNATS(t, p.URL)
}

// Stats asks the child for its message counts and CPU time. To count a
// client's messages, Flush the client first: the server has then read
// everything the client sent before the flush.
func (p *NATSProcess) Stats(t testing.TB) NATSProcessStats {
	t.Helper()
	if _, err := io.WriteString(p.in, "stats\n"); err != nil {
		t.Fatalf("nats child stats: %v", err)
	}
	if !p.out.Scan() {
		t.Fatalf("nats child stats: no answer: %v", p.out.Err())
	}
	var s NATSProcessStats
	if err := json.Unmarshal(p.out.Bytes(), &s); err != nil {
		t.Fatalf("nats child stats %q: %v", p.out.Text(), err)
	}
	return s
}
