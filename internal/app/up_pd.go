package app

import (
	"fmt"
	"net"
	"regexp"
	"strconv"

	"github.com/switchyard/switchyard/wire"
)

// A disaggregated fleet in `up -pd xPyD [-kv-transfer vllm|sglang]`: the
// first x simulated workers prefill, the next y decode, the rest (of
// -workers, raised to x+y when smaller) run both and take the requests the
// decider keeps aggregated. Each role worker speaks the chosen protocol
// (worker_pd.go); an SGLang prefill's bootstrap server takes a free port,
// which it registers, so -pd adds no fixed port.

// pdSpec matches xPyD (case-insensitive P and D).
var pdSpec = regexp.MustCompile(`^([0-9]{1,3})[Pp]([0-9]{1,3})[Dd]$`)

// parsePDShape reads an xPyD fleet shape: both counts at least one.
func parsePDShape(s string) (prefill, decode int, err error) {
	m := pdSpec.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, fmt.Errorf("-pd %q must read xPyD, for example 2P2D", s)
	}
	prefill, _ = strconv.Atoi(m[1])
	decode, _ = strconv.Atoi(m[2])
	if prefill < 1 || decode < 1 {
		return 0, 0, fmt.Errorf("-pd %q needs at least one prefill and one decode worker", s)
	}
	return prefill, decode, nil
}

// pdWorkers raises the worker count to hold the -pd role workers.
func (c *UpConfig) pdWorkers() {
	c.Workers = max(c.Workers, c.PDPrefill+c.PDDecode)
}

// validatePD names what -pd cannot run with.
func (c UpConfig) validatePD() error {
	if c.PDPrefill+c.PDDecode == 0 {
		return nil
	}
	switch {
	case c.Protocol != ProtocolNative:
		return fmt.Errorf("-pd runs native simulated workers: not with -protocol %s", c.Protocol)
	case c.TLS:
		return fmt.Errorf("-pd does not run with -tls (the KV hand-off between simulated workers is plain HTTP)")
	case c.PDTransfer != wire.TransferVLLM && c.PDTransfer != wire.TransferSGLang:
		return fmt.Errorf("-kv-transfer %q must be vllm or sglang", c.PDTransfer)
	}
	return nil
}

// pdRole gives worker i its -pd role.
func (c UpConfig) pdRole(i int, wc *WorkerConfig) {
	switch {
	case i < c.PDPrefill:
		wc.PD.Role = wire.RolePrefill
	case i < c.PDPrefill+c.PDDecode:
		wc.PD.Role = wire.RoleDecode
	default:
		return
	}
	wc.PD.KVTransfer = c.PDTransfer
	if wc.PD.Role == wire.RolePrefill && c.PDTransfer == wire.TransferSGLang {
		wc.PD.BootstrapListen = net.JoinHostPort(c.Host, "0")
	}
}

// pdBanner says which workers -pd gave a role.
func pdBanner(c UpConfig) string {
	n := c.PDPrefill + c.PDDecode
	if n == 0 {
		return ""
	}
	span := func(from, to int) string {
		if from == to {
			return fmt.Sprintf("worker-%d", from)
		}
		return fmt.Sprintf("worker-%d..%d", from, to)
	}
	s := fmt.Sprintf("  disaggregated (%s protocol): %s prefill, %s decode",
		c.PDTransfer, span(1, c.PDPrefill), span(c.PDPrefill+1, n))
	if c.Workers > n {
		s += fmt.Sprintf(", %s both (aggregated requests)", span(n+1, c.Workers))
	}
	return s + "\n"
}
