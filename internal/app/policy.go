package app

import _ "embed"

// defaultPolicyYAML is deploy/policy.yaml, embedded so that a replica started
// without a policy file seeds the same classes `switchyard up` uses.
//
//go:embed default_policy.yaml
var defaultPolicyYAML []byte
