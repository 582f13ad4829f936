package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/switchyard/switchyard/scheduler"
)

// Sentinel errors of the frontend. Every APIError wraps one of them so callers
// (and tests) can use errors.Is.
var (
	// ErrBadRequest marks malformed or invalid client input (HTTP 400).
	ErrBadRequest = errors.New("frontend: bad request")
	// ErrTooLarge marks a body over Config.MaxBodyBytes (HTTP 413).
	ErrTooLarge = errors.New("frontend: request too large")
	// ErrUnknownModel marks a model no registered worker serves (HTTP 404).
	ErrUnknownModel = errors.New("frontend: unknown model")
	// ErrUpstream marks a worker failure that could not be retried (HTTP 502).
	ErrUpstream = errors.New("frontend: upstream failed")
	// ErrNotReady marks a replica that cannot serve yet (HTTP 503).
	ErrNotReady = errors.New("frontend: not ready")
	// ErrShuttingDown marks requests refused during graceful shutdown.
	ErrShuttingDown = errors.New("frontend: shutting down")
)

// OpenAI error "type" values.
const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
)

// APIError is an error with its HTTP status and OpenAI error body. It is
// returned by request parsing and by admission error mapping, and written
// once by the handler.
type APIError struct {
	Status     int
	Type       string
	Code       string
	Param      string
	Message    string
	RetryAfter int // seconds; 0 = no Retry-After header
	err        error
}

func (e *APIError) Error() string { return e.Message }

// Unwrap returns the sentinel (or scheduler error) behind e.
func (e *APIError) Unwrap() error { return e.err }

// errorBody is the OpenAI error envelope.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// body returns e's OpenAI JSON error object.
func (e *APIError) body() []byte {
	obj := errorBody{Error: errorObject{Message: e.Message, Type: e.Type}}
	if e.Param != "" {
		obj.Error.Param = &e.Param
	}
	if e.Code != "" {
		obj.Error.Code = &e.Code
	}
	b, _ := json.Marshal(obj) // only strings: cannot fail
	return b
}

// write sends e as the response.
func (e *APIError) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(e.body(), '\n'))
}

// badRequest returns a 400 naming the offending parameter.
func badRequest(param, code, msg string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: param, Code: code, Message: msg, err: ErrBadRequest}
}

// admissionError maps an Admitter error to its HTTP form (design §10). It
// returns nil when the client is gone (nothing can be written).
func admissionError(err error, retryAfter int) *APIError {
	var api *APIError
	switch {
	case errors.As(err, &api):
		return api
	case errors.Is(err, scheduler.ErrDeadlineExceeded):
		return &APIError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "deadline_exceeded",
			Message: "the request's deadline passed before it could be admitted: " + err.Error(), err: err}
	case errors.Is(err, scheduler.ErrQuotaExceeded):
		return quotaError(err, retryAfter)
	case errors.Is(err, scheduler.ErrQueueFull):
		return &APIError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "queue_full",
			Message: "the class queue is full: " + err.Error(), RetryAfter: retryAfter, err: err}
	case errors.Is(err, scheduler.ErrNoEndpoints):
		return &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "no_endpoints",
			Message: "no workers are registered for this request", RetryAfter: retryAfter, err: err}
	case errors.Is(err, scheduler.ErrInvalidConstraint):
		return &APIError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: "invalid_constraint",
			Param: "x-switchyard-worker", Message: err.Error(), err: err}
	case errors.Is(err, scheduler.ErrUnknownClass):
		return &APIError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: "unknown_class",
			Param: "x-switchyard-class", Message: err.Error(), err: err}
	case errors.Is(err, scheduler.ErrOwnershipMoved):
		return &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "ownership_moved",
			Message: "the class is moving to another replica; retry", RetryAfter: retryAfter, err: err}
	case errors.Is(err, scheduler.ErrCancelled), errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return &APIError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "deadline_exceeded",
			Message: "the request's deadline passed before it could be admitted", err: err}
	}
	var rej *scheduler.RejectError
	if errors.As(err, &rej) {
		return &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: rej.Reason.String(),
			Message: err.Error(), RetryAfter: retryAfter, err: err}
	}
	return &APIError{Status: http.StatusInternalServerError, Type: typeServer, Code: "internal_error",
		Message: "admission failed: " + err.Error(), err: err}
}
