package adapter

import (
	"flag"
	"fmt"

	"github.com/switchyard/switchyard/wire"
)

// RoleConfig is the engine's part in a disaggregated fleet as the adapter
// registers it (wire.WorkerInfo.Role, KVTransfer, BootstrapPort).
//
// Where the engine says it, the adapter reads it: SGLang's server info
// carries its server arguments, disaggregation_mode (null, prefill or
// decode) and disaggregation_bootstrap_port. vLLM exposes its
// --kv-transfer-config (kv_role kv_producer, kv_consumer or kv_both)
// nowhere a client reads: not /v1/models, not the vllm:cache_config_info
// metric (cache settings only), and /server_info only in dev mode
// (VLLM_SERVER_DEV_MODE). So a vLLM engine's role comes from -role. Flags
// win over what the engine says.
type RoleConfig struct {
	// Role is wire.RolePrefill, wire.RoleDecode, wire.RoleBoth, or "" for
	// what the engine says (both when it says nothing).
	Role string
	// KVTransfer is wire.TransferVLLM or wire.TransferSGLang; "" is the
	// engine kind's own (sglang for -engine sglang, vllm otherwise).
	KVTransfer string
	// BootstrapPort is an SGLang prefill's bootstrap port (0: from the
	// engine's server info).
	BootstrapPort int
}

func (c *RoleConfig) registerFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Role, prefix+"role", c.Role, "the engine's disaggregation role: prefill, decode or both (empty: from SGLang's server info, else both)")
	fs.StringVar(&c.KVTransfer, prefix+"kv-transfer", c.KVTransfer, "KV transfer protocol of a prefill or decode engine: vllm or sglang (empty: the engine kind's)")
	fs.IntVar(&c.BootstrapPort, prefix+"bootstrap-port", c.BootstrapPort, "an SGLang prefill's --disaggregation-bootstrap-port (0: from its server info)")
}

// Validate names the first bad field.
func (c RoleConfig) Validate() error {
	switch {
	case c.Role != "" && c.Role != wire.RoleBoth && c.Role != wire.RolePrefill && c.Role != wire.RoleDecode:
		return fmt.Errorf("adapter config: Role %q must be prefill, decode or both", c.Role)
	case c.KVTransfer != "" && c.KVTransfer != wire.TransferVLLM && c.KVTransfer != wire.TransferSGLang:
		return fmt.Errorf("adapter config: KVTransfer %q must be vllm or sglang", c.KVTransfer)
	case c.BootstrapPort < 0 || c.BootstrapPort > 65535:
		return fmt.Errorf("adapter config: BootstrapPort %d must be in [0, 65535]", c.BootstrapPort)
	}
	return nil
}

// apply sets info's role fields from the flags, then from what the engine
// said (d), for an engine of kind.
func (c RoleConfig) apply(info *wire.WorkerInfo, d Discovered, kind Engine) {
	role, port := c.Role, c.BootstrapPort
	if role == "" {
		role = d.Role
	}
	if port == 0 {
		port = d.BootstrapPort
	}
	if role == "" || role == wire.RoleBoth {
		return // registered as before: absent reads as both
	}
	info.Role = role
	info.KVTransfer = c.KVTransfer
	if info.KVTransfer == "" {
		info.KVTransfer = wire.TransferVLLM
		if kind == EngineSGLang {
			info.KVTransfer = wire.TransferSGLang
		}
	}
	if role == wire.RolePrefill && info.KVTransfer == wire.TransferSGLang {
		info.BootstrapPort = port
	}
}
