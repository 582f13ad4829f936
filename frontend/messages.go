package frontend

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/anthropic"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
)

// Anthropic's Messages API (docs/api.md, "Anthropic Messages API"). A
// Messages request takes the chat completions path: the same admission,
// tenants, classes and deadlines, tokenized in its chat form. Only the
// edges differ: parseMessages reads the body, upstream picks per granted
// worker between forwarding it as is (an engine serving /v1/messages) and
// its chat completions translation, and an anthropic.Writer in front of
// the handler gives every answer and error the Messages shape.

// messagesRequest is what a Messages request carries beside the common
// parsedRequest: its chat completions form for engines without the API.
type messagesRequest struct {
	chat  []byte
	stops []string
	// native is set for the current attempt when its worker serves
	// /v1/messages itself (the stream is then Messages events).
	native bool
}

// messagesMetrics count Messages requests refused as invalid and the
// forward path of the ones sent to a worker.
type messagesMetrics struct {
	invalid   *prometheus.CounterVec // reason
	forwarded *prometheus.CounterVec // path
}

func newMessagesMetrics(reg prometheus.Registerer) *messagesMetrics {
	f := promauto.With(reg)
	return &messagesMetrics{
		invalid: f.NewCounterVec(prometheus.CounterOpts{Name: metrics.NameRouterMessagesInvalid,
			Help: "Anthropic Messages requests refused with 400 before admission, by reason (the error's code: invalid_json, missing_required_parameter, invalid_value, ...)."},
			[]string{"reason"}),
		forwarded: f.NewCounterVec(prometheus.CounterOpts{Name: metrics.NameRouterMessagesForwarded,
			Help: "Anthropic Messages attempts sent to a worker, by path: native (the engine serves /v1/messages) or translated (sent as chat completions and translated back)."},
			[]string{"path"}),
	}
}

// The forward paths of a Messages attempt.
const (
	messagesNative     = "native"
	messagesTranslated = "translated"
)

// handleMessagesRoute serves h behind an anthropic.Writer: errors (the
// instrument's own included) in Anthropic's shape, request-id and
// anthropic-version headers on every answer.
func (s *Server) handleMessagesRoute(route string, h func(http.ResponseWriter, *http.Request) int) http.HandlerFunc {
	inner := s.instrument(route, h)
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("anthropic-version"); v != "" {
			w.Header().Set("anthropic-version", v)
		}
		aw := anthropic.NewWriter(w, nil, 0, false)
		inner(aw, r)
		aw.Finish()
	}
}

// parseMessages is parseRequest for a Messages body.
func parseMessages(body []byte, h http.Header) (*parsedRequest, *APIError) {
	if !json.Valid(body) {
		var v any
		return nil, jsonError(json.Unmarshal(body, &v))
	}
	if e := checkKeys(body); e != nil {
		return nil, e
	}
	req, err := anthropic.Decode(body, false)
	if err != nil {
		return nil, messagesError(err)
	}
	chat, err := anthropic.ToChat(req)
	if err != nil {
		return nil, messagesError(err)
	}
	in, err := prompt.Parse(prompt.KindChat, &prompt.Fields{Messages: chat.Messages, Tools: chat.Tools, ChatTemplateKwargs: req.ChatTemplateKwargs})
	if err != nil {
		return nil, promptError(err)
	}
	var hb struct {
		Switchyard *hintBody `json:"switchyard"`
	}
	if err := json.Unmarshal(body, &hb); err != nil {
		return nil, jsonError(err)
	}
	p := &parsedRequest{endpoint: endpointMessages, model: req.Model, stream: req.Stream, maxTokens: *req.MaxTokens,
		sequences: 1, user: req.UserID(), input: in, forward: body,
		messages: &messagesRequest{chat: chat.Body, stops: req.StopSequences}}
	var apiErr *APIError
	if p.hints, apiErr = parseHints(hb.Switchyard, h); apiErr != nil {
		return nil, apiErr
	}
	if hb.Switchyard != nil {
		if p.forward, err = stripField(body, "switchyard"); err != nil {
			return nil, jsonError(err)
		}
	}
	return p, nil
}

// messagesError maps an anthropic package error to a 400.
func messagesError(err error) *APIError {
	var re *anthropic.RequestError
	if errors.As(err, &re) {
		return badRequest(re.Param, re.Code, re.Message)
	}
	return &APIError{Status: http.StatusInternalServerError, Type: typeServer, Code: "internal_error", Message: err.Error(), err: err}
}

// upstream is the path and body an attempt sends to worker g: the
// endpoint's own, or for a Messages request either the client's body to
// /v1/messages (the worker serves it) or its chat form to
// /v1/chat/completions, the response writer told to translate back.
func (x *exchange) upstream(g scheduler.Grant) (string, []byte) {
	m := x.p.messages
	if m == nil {
		return x.p.endpoint.path(), x.p.forward
	}
	m.native = x.s.servesMessages(g.Worker)
	if aw, ok := x.w.(*anthropic.Writer); ok {
		aw.Configure(m.stops, x.p.promptTokens, !m.native)
	}
	if m.native {
		x.s.messages.forwarded.WithLabelValues(messagesNative).Inc()
		return endpointMessages.path(), x.p.forward
	}
	x.s.messages.forwarded.WithLabelValues(messagesTranslated).Inc()
	return endpointChat.path(), m.chat
}

// nativeAttempt reports whether the current attempt of a Messages
// request went to a worker serving the API itself (false for any other
// request).
func (m *messagesRequest) nativeAttempt() bool { return m != nil && m.native }

// servesMessages reports whether the worker registered Anthropic's
// Messages API among its APIs.
func (s *Server) servesMessages(worker string) bool {
	for _, w := range s.deps.Workers.Workers() {
		if w.ID == worker {
			return w.Messages
		}
	}
	return false
}

// count adds a refused Messages request to the invalid counter.
func (m *messagesMetrics) count(ep endpoint, e *APIError) {
	if ep == endpointMessages && e != nil && e.Status == http.StatusBadRequest {
		m.invalid.WithLabelValues(e.Code).Inc()
	}
}

// nativeStreamEvent classifies a data payload of a stream in Messages
// form: message_stop ends it; message_delta carries its usage.
func nativeStreamEvent(payload []byte) (done, usage bool) {
	var ev struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(payload, &ev) != nil {
		return false, false
	}
	return ev.Type == "message_stop", ev.Type == "message_delta"
}

// countTokens is the answer of /v1/messages/count_tokens.
type countTokens struct {
	InputTokens int `json:"input_tokens"`
}

// handleCountTokens answers POST /v1/messages/count_tokens from the
// router's own tokenization of the request's chat form (the model's
// tokenizer and chat template, or its engine's /tokenize; approximate
// without either, as for routing).
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) int {
	w.Header().Set(HeaderRequestID, s.nextID())
	n, apiErr := s.countTokens(w, r)
	if apiErr != nil {
		apiErr.write(w)
		return apiErr.Status
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(countTokens{InputTokens: n})
	return http.StatusOK
}

func (s *Server) countTokens(w http.ResponseWriter, r *http.Request) (int, *APIError) {
	if err := s.ready(); err != nil {
		return 0, &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "not_ready",
			Message: "the router is not ready: " + err.Error(), RetryAfter: s.retryAfter(), err: ErrNotReady}
	}
	tn, apiErr := s.authenticate(r)
	if apiErr != nil {
		return 0, apiErr
	}
	body, apiErr := s.readBody(w, r)
	if apiErr != nil {
		return 0, apiErr
	}
	if !json.Valid(body) {
		var v any
		apiErr = jsonError(json.Unmarshal(body, &v))
		s.messages.count(endpointMessages, apiErr)
		return 0, apiErr
	}
	req, err := anthropic.Decode(body, true)
	if err != nil {
		apiErr = messagesError(err)
		s.messages.count(endpointMessages, apiErr)
		return 0, apiErr
	}
	if tn != nil {
		if _, apiErr := s.authorize(tn, req.Model, "", s.policy.Load()); apiErr != nil {
			return 0, apiErr
		}
	}
	chat, err := anthropic.ToChat(req)
	if err != nil {
		return 0, messagesError(err)
	}
	in, err := prompt.Parse(prompt.KindChat, &prompt.Fields{Messages: chat.Messages, Tools: chat.Tools, ChatTemplateKwargs: req.ChatTemplateKwargs})
	if err != nil {
		return 0, promptError(err)
	}
	rt, apiErr := s.route(req.Model)
	if apiErr != nil {
		return 0, apiErr
	}
	res, err := s.deps.Prompts.Tokenize(r.Context(), req.Model, in, rt.engines)
	if err != nil {
		return 0, promptError(err)
	}
	return res.Total, nil
}
