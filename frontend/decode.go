package frontend

import (
	"encoding/json"
	"strconv"

	"github.com/switchyard/switchyard/prompt"
)

// decodeRequest fills req from body as json.Unmarshal would, in one
// validating pass (prompt.ScanObject) that keeps the prompt fields as
// slices of body instead of copies. A long chat's body was otherwise
// validated and copied once per nesting level. It returns false whenever
// it cannot vouch for the result — invalid JSON, a value of the wrong
// type, a repeated field, a key that needs unescaping or matches a field
// only without case (encoding/json accepts those) — and the caller then
// decodes with encoding/json, which yields the same value or the error.
func decodeRequest(body []byte, req *openAIRequest) bool {
	var sc bodyScan
	return decodeRequestScan(body, req, &sc)
}

// bodyScan is what decodeRequestScan learnt of the body that the rest of
// the request's parse needs: withStreamUsageAt inserts stream_options from
// it without scanning the body again, and checkKeys need not walk an
// unambiguous body.
type bodyScan struct {
	members       int    // top-level members
	streamOptions []byte // the stream_options value (a slice of body); nil: absent
	// unambiguous is set when the scan found the body unambiguous
	// (prompt.ScanObjectChecked with structFields): checkKeys would pass it.
	unambiguous bool
}

// decodeRequestScan is decodeRequest, also filling sc when it returns
// true (every key then is unescaped and unique, so sc names the one
// stream_options member encoding/json would read). Its scan is the body's
// one validating pass: it also tells whether checkKeys has anything to
// find (sc.unambiguous).
func decodeRequestScan(body []byte, req *openAIRequest, sc *bodyScan) bool {
	var buf [16]prompt.Member
	members, unambiguous, ok := prompt.ScanObjectChecked(body, buf[:0], maxBodyNesting, structFields)
	if !ok {
		return false
	}
	sc.members, sc.unambiguous = len(members), unambiguous
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

// requestFields are the keys of openAIRequest and prompt.Fields.
var requestFields = [...]string{
	"model", "max_tokens", "max_completion_tokens", "max_output_tokens", "stream", "user", "switchyard",
	"prompt", "messages", "input", "instructions", "tools", "add_generation_prompt",
	"continue_final_message", "chat_template_kwargs", "add_special_tokens",
	"n", "best_of", "stream_options", "prompt_cache_key",
}

// requestFieldIndex is key's index in requestFields, -1 for a key the
// router does not read, and len(requestFields) for one that matches a
// field only without case (which decodeRequest leaves to encoding/json).
func requestFieldIndex(key []byte) int {
	for i, name := range requestFields {
		if string(key) == name {
			return i
		}
	}
	for _, name := range requestFields {
		if prompt.FoldsTo(key, name) {
			return len(requestFields)
		}
	}
	return -1
}

func decodeRequestField(req *openAIRequest, name string, m prompt.Member) bool {
	v := m.Value
	null := string(v) == "null"
	switch name {
	case "model":
		if null {
			req.Model = nil
			return true
		}
		s, ok := plainJSONString(m)
		req.Model = &s
		return ok
	case "user":
		if null {
			return true
		}
		s, ok := plainJSONString(m)
		req.User = s
		return ok
	case "prompt_cache_key":
		if null {
			return true
		}
		s, ok := plainJSONString(m)
		req.PromptCacheKey = s
		return ok
	case "max_tokens":
		return decodeIntPtr(v, null, &req.MaxTokens)
	case "max_completion_tokens":
		return decodeIntPtr(v, null, &req.MaxCompletionTokens)
	case "max_output_tokens":
		return decodeIntPtr(v, null, &req.MaxOutputTokens)
	case "stream":
		return decodeBool(v, null, &req.Stream)
	case "n":
		return decodeIntPtr(v, null, &req.N)
	case "best_of":
		return decodeIntPtr(v, null, &req.BestOf)
	case "stream_options":
		if null {
			req.StreamOptions = nil
			return true
		}
		if v[0] != '{' {
			return false
		}
		var o streamOptions
		if json.Unmarshal(v, &o) != nil {
			return false
		}
		req.StreamOptions = &o
		return true
	case "continue_final_message":
		return decodeBool(v, null, &req.ContinueFinalMessage)
	case "add_generation_prompt":
		return decodeBoolPtr(v, null, &req.AddGenerationPrompt)
	case "add_special_tokens":
		return decodeBoolPtr(v, null, &req.AddSpecialTokens)
	case "switchyard":
		if null {
			return true
		}
		if v[0] != '{' {
			return false
		}
		// Small and rare: encoding/json decodes it, and any error is left
		// to the full decode so the message names the field the same way.
		var h hintBody
		if json.Unmarshal(v, &h) != nil {
			return false
		}
		req.Switchyard = &h
		return true
	case "prompt":
		req.Prompt = v
	case "messages":
		req.Messages = v
	case "input":
		req.Input = v
	case "instructions":
		req.Instructions = v
	case "tools":
		req.Tools = v
	case "chat_template_kwargs":
		req.ChatTemplateKwargs = v
	}
	return true
}

// plainJSONString is a string member's text when it needs no unescaping.
func plainJSONString(m prompt.Member) (string, bool) {
	if !m.PlainString {
		return "", false
	}
	return string(m.Value[1 : len(m.Value)-1]), true
}

func decodeIntPtr(v []byte, null bool, dst **int) bool {
	if null {
		*dst = nil
		return true
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		return false // floats, exponents, overflow and wrong types: encoding/json says which
	}
	*dst = &n
	return true
}

func decodeBool(v []byte, null bool, dst *bool) bool {
	switch {
	case null:
	case string(v) == "true":
		*dst = true
	case string(v) == "false":
		*dst = false
	default:
		return false
	}
	return true
}

func decodeBoolPtr(v []byte, null bool, dst **bool) bool {
	if null {
		*dst = nil
		return true
	}
	var b bool
	if !decodeBool(v, false, &b) {
		return false
	}
	*dst = &b
	return true
}
