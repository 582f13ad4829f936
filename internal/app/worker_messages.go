package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/switchyard/switchyard/anthropic"
	"github.com/switchyard/switchyard/prompt"
)

// The simulated worker's Anthropic Messages API: served natively, as vLLM
// serves it, by translating to the worker's own chat completions and the
// answer back (package anthropic, the code routers translate with for
// engines without the API).

func (w *worker) messagesRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/messages", w.handle("messages", w.handleMessages))
	mux.HandleFunc("POST /v1/messages/count_tokens", w.handle("messages_count_tokens", w.handleMessagesCountTokens))
}

func (w *worker) handleMessages(rw http.ResponseWriter, r *http.Request, body []byte) string {
	req, chat, in, apiErr := w.parseMessages(body, false)
	if apiErr != nil {
		aw := anthropic.NewWriter(rw, nil, 0, false)
		writeWorkerError(aw, apiErr)
		aw.Finish()
		return "bad_request"
	}
	// message_start reports the prompt's size before the engine's usage.
	n := 0
	if ids, err := w.tokenize(req.Model, in); err == nil {
		for _, p := range ids {
			n += len(p)
		}
	}
	aw := anthropic.NewWriter(rw, req.StopSequences, n, true)
	defer aw.Finish()
	return w.handleGenerate(prompt.KindChat)(aw, r, chat.Body)
}

func (w *worker) handleMessagesCountTokens(rw http.ResponseWriter, _ *http.Request, body []byte) string {
	aw := anthropic.NewWriter(rw, nil, 0, false)
	defer aw.Finish()
	req, _, in, apiErr := w.parseMessages(body, true)
	if apiErr == nil && !w.serves(req.Model) {
		apiErr = &workerAPIError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model",
			Code: "model_not_found", Message: "the model " + strconv.Quote(req.Model) + " does not exist"}
	}
	var ids [][]uint32
	if apiErr == nil {
		var err error
		if ids, err = w.tokenize(req.Model, in); err != nil {
			apiErr = promptAPIError(err)
		}
	}
	if apiErr != nil {
		writeWorkerError(aw, apiErr)
		return "bad_request"
	}
	n := 0
	for _, p := range ids {
		n += len(p)
	}
	writeWorkerJSON(aw, http.StatusOK, map[string]int{"input_tokens": n})
	return "ok"
}

// parseMessages decodes a Messages body into its chat completions form and
// the chat's parsed prompt.
func (w *worker) parseMessages(body []byte, counting bool) (*anthropic.Request, *anthropic.Chat, *prompt.Input, *workerAPIError) {
	req, err := anthropic.Decode(body, counting)
	if err == nil {
		var chat *anthropic.Chat
		if chat, err = anthropic.ToChat(req); err == nil {
			in, perr := prompt.Parse(prompt.KindChat, &prompt.Fields{Messages: chat.Messages, Tools: chat.Tools, ChatTemplateKwargs: req.ChatTemplateKwargs})
			if perr != nil {
				return nil, nil, nil, promptAPIError(perr)
			}
			return req, chat, in, nil
		}
	}
	var re *anthropic.RequestError
	if errors.As(err, &re) {
		return nil, nil, nil, workerBadRequest(re.Param, re.Code, re.Message)
	}
	return nil, nil, nil, workerBadRequest("", "invalid_value", err.Error())
}

// toolCallOut is a chat tool call of an answer or (with Index) a delta.
type toolCallOut struct {
	Index    *int             `json:"index,omitempty"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// forcedTool is the function a chat request makes the model call:
// tool_choice naming one, or "required" (the first tool), unless the
// conversation's last message is a tool's result, which the model then
// answers with text. The simulated engine has no model to decide, so
// "auto" never calls a tool.
func forcedTool(choice json.RawMessage, in *prompt.Input) string {
	if len(in.Messages) > 0 && in.Messages[len(in.Messages)-1].Role == "tool" {
		return ""
	}
	choice = bytes.TrimSpace(choice)
	var name string
	switch {
	case string(choice) == `"required"`:
		if len(in.Tools) == 0 {
			return ""
		}
		var t struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(in.Tools[0], &t) != nil {
			return ""
		}
		name = t.Function.Name
	case len(choice) > 0 && choice[0] == '{':
		var c struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(choice, &c) != nil {
			return ""
		}
		name = c.Function.Name
	}
	return name
}

// toolArguments is a call's arguments: the generated text as the "text"
// member of an object.
func toolArguments(text string) string {
	b, _ := json.Marshal(map[string]string{"text": text}) // a string: cannot fail
	return string(b)
}

// toolCall is choice i's whole call.
func (p *responder) toolCall(i int, args string) toolCallOut {
	return toolCallOut{ID: p.toolCallID(i), Type: "function", Function: toolCallFunction{Name: p.req.ToolCall, Arguments: args}}
}

func (p *responder) toolCallID(i int) string {
	if i == 0 {
		return "call_" + p.id
	}
	return "call_" + p.id + "_" + strconv.Itoa(i)
}

// toolCallDelta streams a call's arguments a token at a time: the first
// delta names the call and opens the object, the last closes it; their
// concatenation is toolArguments of the whole text.
func (p *responder) toolCallDelta(i int, piece string, first, last bool) *chatContent {
	esc, _ := json.Marshal(piece) // a string: cannot fail
	args := string(esc[1 : len(esc)-1])
	zero := 0
	tc := toolCallOut{Index: &zero, Function: toolCallFunction{Arguments: args}}
	if first {
		tc.ID, tc.Type, tc.Function.Name = p.toolCallID(i), "function", p.req.ToolCall
		tc.Function.Arguments = `{"text":"` + args
	}
	if last {
		tc.Function.Arguments += `"}`
	}
	return &chatContent{ToolCalls: []toolCallOut{tc}}
}
