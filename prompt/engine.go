package prompt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
)

// maxTokenizeResponse bounds an engine's /tokenize answer.
const maxTokenizeResponse = 16 << 20

// vLLM's /tokenize request bodies (vllm/entrypoints/serve/tokenize/
// protocol.py: TokenizeCompletionRequest, TokenizeChatRequest).
type tokenizeCompletion struct {
	Model            string `json:"model"`
	Prompt           string `json:"prompt"`
	AddSpecialTokens bool   `json:"add_special_tokens"`
}

type tokenizeChat struct {
	Model                string            `json:"model"`
	Messages             []json.RawMessage `json:"messages"`
	AddGenerationPrompt  bool              `json:"add_generation_prompt"`
	ContinueFinalMessage bool              `json:"continue_final_message"`
	Tools                []json.RawMessage `json:"tools,omitempty"`
	ChatTemplateKwargs   json.RawMessage   `json:"chat_template_kwargs,omitempty"`
}

// engineBody is the /tokenize request for in's first prompt or its chat.
// Messages whose content had parts are sent with the flattened content:
// an engine would fetch and decode every image to tokenize it, which no
// short timeout allows; text-only conversations tokenize exactly.
func engineBody(model string, in *Input) ([]byte, error) {
	if !in.IsChat() {
		return json.Marshal(tokenizeCompletion{Model: model, Prompt: in.Prompts[0].Text, AddSpecialTokens: in.AddSpecial})
	}
	req := tokenizeChat{Model: model, AddGenerationPrompt: in.AddGenerationPrompt,
		ContinueFinalMessage: in.ContinueFinalMessage, Tools: in.Tools, ChatTemplateKwargs: in.Kwargs}
	req.Messages = make([]json.RawMessage, len(in.Messages))
	for i, m := range in.Messages {
		req.Messages[i] = m.Raw
		if !m.NullContent && !stringContent(m.Raw) {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(m.Raw, &obj); err != nil {
				return nil, err
			}
			obj["content"] = mustJSON(m.Content)
			req.Messages[i] = mustJSON(obj)
		}
	}
	return json.Marshal(req)
}

// stringContent reports whether a message's content is a JSON string.
func stringContent(raw json.RawMessage) bool {
	var wm wireMessage
	if json.Unmarshal(raw, &wm) != nil {
		return false
	}
	c := bytes.TrimSpace(wm.Content)
	return len(c) > 0 && c[0] == '"'
}

// engineTokenize asks the engine at base (a worker's base URL) for the ids
// of in's first prompt (or its chat).
func (r *Registry) engineTokenize(ctx context.Context, base, model string, in *Input) ([]uint32, error) {
	body, err := engineBody(model, in)
	if err != nil {
		return nil, fmt.Errorf("%w: encode request: %v", ErrEngine, err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.EngineTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrEngine, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrEngine, base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeResponse+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: read: %v", ErrEngine, base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %s", ErrEngine, base, resp.Status)
	}
	if len(raw) > maxTokenizeResponse {
		return nil, fmt.Errorf("%w: %s: answer larger than %d bytes", ErrEngine, base, maxTokenizeResponse)
	}
	return decodeTokenizeResponse(raw)
}

// decodeTokenizeResponse parses a /tokenize answer, refusing ids outside
// uint32 and an answer with no tokens field.
func decodeTokenizeResponse(raw []byte) ([]uint32, error) {
	var tr struct {
		Tokens *[]int64 `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &tr); err != nil {
		return nil, fmt.Errorf("%w: malformed answer: %v", ErrEngine, err)
	}
	if tr.Tokens == nil {
		return nil, fmt.Errorf("%w: answer has no tokens", ErrEngine)
	}
	out := make([]uint32, len(*tr.Tokens))
	for i, v := range *tr.Tokens {
		if v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("%w: token %d is %d, outside [0, 2^32)", ErrEngine, i, v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}
