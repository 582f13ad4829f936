package app

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/switchyard/switchyard/prompt"
)

// The simulated worker's sampling fields: it generates synthetic tokens, so
// it cannot return log probabilities nor constrain its output to a format.
// A request asking for either is rejected rather than silently served
// without it, and temperature is checked as vLLM checks it, so a client
// tested against the simulator meets the same 400s on a real engine.
//
// The messages are vLLM's (vllm/sampling_params.py, SamplingParams.
// _verify_args, and the max_logprobs check of its input processor, on
// vllm-project/vllm main as of commit 00388f6573cc), including the
// " (parameter=..., value=...)" suffix its VLLMValidationError adds. The
// simulator behaves as a vLLM started with --max-logprobs 0.

// maxTemperature is vLLM's upper bound on temperature.
const maxTemperature = 2.0

// rawSampling are the sampling fields of a generation request.
type rawSampling struct {
	Temperature *float64 `json:"temperature"`
	// Logprobs is a bool in a chat request and an integer (or null) in a
	// completions request.
	Logprobs       json.RawMessage `json:"logprobs"`
	TopLogprobs    *int64          `json:"top_logprobs"`
	ResponseFormat *struct {
		Type string `json:"type"`
	} `json:"response_format"`
}

// vllmInvalid is a 400 worded as vLLM's VLLMValidationError prints it.
func vllmInvalid(param, value, msg string) *workerAPIError {
	return workerBadRequest(param, "invalid_value", fmt.Sprintf("%s (parameter=%s, value=%s)", msg, param, value))
}

// pyFloat formats v as Python's repr of a float does ("3.0", "2.5",
// "1e+20"), for vLLM's messages.
func pyFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e16 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// checkSampling rejects the sampling fields the simulated engine cannot
// honour (nil when it can honour them all).
func checkSampling(kind prompt.Kind, s *rawSampling) *workerAPIError {
	if t := s.Temperature; t != nil {
		switch v := pyFloat(*t); {
		case *t < 0:
			return vllmInvalid("temperature", v, fmt.Sprintf("temperature must be non-negative, got %s.", v))
		case *t > maxTemperature:
			return vllmInvalid("temperature", v, fmt.Sprintf("temperature must be in [0, 2], got %s.", v))
		}
	}
	if e := checkLogprobs(kind, s); e != nil {
		return e
	}
	if rf := s.ResponseFormat; rf != nil && rf.Type != "" && rf.Type != "text" {
		return workerBadRequest("response_format", "invalid_value", fmt.Sprintf(
			"response_format type %q is not supported by the simulated engine: it generates synthetic tokens and cannot constrain them (only \"text\")", rf.Type))
	}
	return nil
}

// checkLogprobs rejects every request for log probabilities: the simulated
// engine computes none (vLLM with --max-logprobs 0).
func checkLogprobs(kind prompt.Kind, s *rawSampling) *workerAPIError {
	raw := s.Logprobs
	if len(raw) == 0 || string(raw) == "null" {
		if s.TopLogprobs != nil && kind == prompt.KindChat {
			return workerBadRequest("top_logprobs", "invalid_value", "when using `top_logprobs`, `logprobs` must be set to true.")
		}
		return nil
	}
	var n int64
	if kind == prompt.KindChat {
		var on bool
		if err := json.Unmarshal(raw, &on); err != nil {
			return workerBadRequest("logprobs", "invalid_type", "logprobs must be a boolean in a chat completion request")
		}
		if !on {
			if s.TopLogprobs != nil {
				return workerBadRequest("top_logprobs", "invalid_value", "when using `top_logprobs`, `logprobs` must be set to true.")
			}
			return nil
		}
		if s.TopLogprobs != nil {
			n = *s.TopLogprobs
		}
		if n == 0 {
			// vLLM would return the sampled tokens' log probabilities; the
			// simulated engine has none to return.
			return workerBadRequest("logprobs", "invalid_value", "the simulated engine computes no log probabilities: logprobs is not supported")
		}
	} else if err := json.Unmarshal(raw, &n); err != nil {
		return workerBadRequest("logprobs", "invalid_type", "logprobs must be an integer")
	}
	v := strconv.FormatInt(n, 10)
	switch {
	case n < 0 && n != -1:
		return vllmInvalid("logprobs", v, fmt.Sprintf("logprobs must be non-negative or -1, got %s.", v))
	case n == 0:
		return nil // completions' logprobs 0: none asked for, as vLLM reads it
	}
	return vllmInvalid("logprobs", v, fmt.Sprintf("Requested sample logprobs of %s, which is greater than max allowed: 0", v))
}
