package frontend

// The request parse as it stood before the decode's scan learnt to tell an
// unambiguous body (decode.go, request.go): the decode scanned with
// prompt.ScanObject, checkKeys walked every body, and prompt.Parse scanned
// the messages again (Fields.Validated unset). The reference of
// FuzzParseRequestAgreesWithTheOldRoute. Kept verbatim but for the names.

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/switchyard/switchyard/prompt"
)

func oldParseRequest(ep endpoint, body []byte, h http.Header) (*parsedRequest, *APIError) {
	if ep == endpointMessages {
		return parseMessages(body, h)
	}
	var req openAIRequest
	var sc bodyScan
	scanned := oldDecodeRequestScan(body, &req, &sc)
	if !scanned {
		req = openAIRequest{}
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, jsonError(err)
		}
	}
	// The body is valid JSON now; the engine must read it as we did.
	if e := checkKeys(body); e != nil {
		return nil, e
	}
	if req.Model == nil || *req.Model == "" {
		return nil, badRequest("model", "missing_required_parameter", "you must provide a model parameter")
	}
	p := &parsedRequest{endpoint: ep, model: *req.Model, stream: req.Stream, user: req.User, promptCacheKey: req.PromptCacheKey, forward: body, sequences: 1}
	if ep == endpointChat || ep == endpointCompletions {
		for _, f := range []struct {
			name string
			v    *int
		}{{"n", req.N}, {"best_of", req.BestOf}} {
			if f.v == nil {
				continue
			}
			if *f.v < 1 || *f.v > maxSequences {
				return nil, badRequest(f.name, "invalid_value", fmt.Sprintf("%s must be between 1 and %d, got %d", f.name, maxSequences, *f.v))
			}
			p.sequences = max(p.sequences, *f.v)
		}
	}
	switch {
	case ep == endpointEmbeddings:
		p.stream = false // embeddings never stream
		p.maxTokens = 1  // a pooling request books no decode
	case req.MaxCompletionTokens != nil && ep == endpointChat:
		p.maxTokens = *req.MaxCompletionTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_completion_tokens", "invalid_value", fmt.Sprintf("max_completion_tokens must be at least 1, got %d", p.maxTokens))
		}
	case req.MaxOutputTokens != nil && ep == endpointResponses:
		p.maxTokens = *req.MaxOutputTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_output_tokens", "invalid_value", fmt.Sprintf("max_output_tokens must be at least 1, got %d", p.maxTokens))
		}
	case req.MaxTokens != nil && ep != endpointResponses:
		p.maxTokens = *req.MaxTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_tokens", "invalid_value", fmt.Sprintf("max_tokens must be at least 1, got %d", p.maxTokens))
		}
	}
	in, err := prompt.Parse(ep.kind(), &req.Fields)
	if err != nil {
		return nil, promptError(err)
	}
	p.input = in
	var apiErr *APIError
	if p.hints, apiErr = parseHints(req.Switchyard, h); apiErr != nil {
		return nil, apiErr
	}
	if req.Switchyard != nil {
		fwd, err := stripField(body, "switchyard")
		if err != nil {
			return nil, jsonError(err)
		}
		p.forward = fwd
	}
	// The tenant's tokens are charged what the engine reports: a stream
	// reports it only when asked, so the router always asks.
	if p.stream && (ep == endpointChat || ep == endpointCompletions) &&
		(req.StreamOptions == nil || req.StreamOptions.IncludeUsage == nil || !*req.StreamOptions.IncludeUsage) {
		var fwd []byte
		var err error
		if scanned && req.Switchyard == nil {
			// p.forward is body, whose members the decode has just scanned.
			fwd, err = withStreamUsageAt(body, sc.streamOptions, sc.members > 0)
		} else {
			fwd, err = withStreamUsage(p.forward)
		}
		if err != nil {
			return nil, jsonError(err)
		}
		p.forward, p.injectedUsage = fwd, true
	}
	return p, nil
}

func oldDecodeRequestScan(body []byte, req *openAIRequest, sc *bodyScan) bool {
	var buf [16]prompt.Member
	members, ok := prompt.ScanObject(body, buf[:0])
	if !ok {
		return false
	}
	sc.members = len(members)
	var seen uint32
	for _, m := range members {
		if m.Escaped {
			return false
		}
		f := requestFieldIndex(m.Key)
		switch {
		case f < 0:
			continue
		case f == len(requestFields):
			return false
		}
		if seen&(1<<f) != 0 {
			return false
		}
		seen |= 1 << f
		if requestFields[f] == "stream_options" {
			sc.streamOptions = m.Value
		}
		if !decodeRequestField(req, requestFields[f], m) {
			return false
		}
	}
	return true
}
