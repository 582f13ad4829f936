package anthropic

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// Anthropic's error types.
const (
	ErrInvalidRequest = "invalid_request_error"
	ErrAuthentication = "authentication_error"
	ErrPermission     = "permission_error"
	ErrNotFound       = "not_found_error"
	ErrTooLarge       = "request_too_large"
	ErrRateLimit      = "rate_limit_error"
	ErrAPI            = "api_error"
	ErrOverloaded     = "overloaded_error"
	ErrTimeout        = "timeout_error"
)

// ErrorType is the Anthropic error type of an HTTP status.
func ErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return ErrAuthentication
	case status == http.StatusForbidden:
		return ErrPermission
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusRequestEntityTooLarge:
		return ErrTooLarge
	case status == http.StatusTooManyRequests:
		return ErrRateLimit
	case status == http.StatusServiceUnavailable || status == 529:
		return ErrOverloaded
	case status == http.StatusGatewayTimeout:
		return ErrTimeout
	case status >= 500:
		return ErrAPI
	}
	return ErrInvalidRequest
}

// Error is Anthropic's error envelope. Code and Param carry the router's
// (OpenAI-style) detail beside Anthropic's type and message; Anthropic's
// SDKs read type and message and ignore the rest.
type Error struct {
	Type  string      `json:"type"`
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is an error's type and message.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Code    string `json:"code,omitempty"`
	Param   string `json:"param,omitempty"`
}

// ErrorBody is the Anthropic envelope of an OpenAI-shaped error object
// (its "error" member's value). status picks the type; 0 keeps the
// object's own type when it is one of Anthropic's, else api_error.
func ErrorBody(status int, obj json.RawMessage) Error {
	var o struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
		Param   *string         `json:"param"`
	}
	_ = json.Unmarshal(obj, &o)
	e := Error{Type: "error", Error: ErrorDetail{Message: o.Message}}
	switch {
	case status != 0:
		e.Error.Type = ErrorType(status)
	case isAnthropicType(o.Type):
		e.Error.Type = o.Type
	default:
		e.Error.Type = ErrAPI
	}
	var code string
	if json.Unmarshal(o.Code, &code) == nil {
		e.Error.Code = code
	} else if len(o.Code) > 0 && string(o.Code) != "null" {
		e.Error.Code = string(o.Code)
	}
	if o.Param != nil {
		e.Error.Param = *o.Param
	}
	if e.Error.Message == "" {
		e.Error.Message = http.StatusText(status)
	}
	return e
}

func isAnthropicType(t string) bool {
	switch t {
	case ErrInvalidRequest, ErrAuthentication, ErrPermission, ErrNotFound, ErrTooLarge, ErrRateLimit, ErrAPI, ErrOverloaded, ErrTimeout:
		return true
	}
	return false
}

// ConvertError turns an error response body into Anthropic's shape: one
// already in it (an engine serving the API) is returned as is; an OpenAI
// one ({"error": {...}}) is re-enveloped with status's type; anything else
// becomes the message of an error of status's type.
func ConvertError(status int, body []byte) []byte {
	var probe struct {
		Type  string          `json:"type"`
		Error json.RawMessage `json:"error"`
	}
	trimmed := bytes.TrimSpace(body)
	if json.Unmarshal(trimmed, &probe) == nil {
		if probe.Type == "error" {
			return body
		}
		if len(probe.Error) > 0 && probe.Error[0] == '{' {
			b, _ := json.Marshal(ErrorBody(status, probe.Error)) // strings only: cannot fail
			return append(b, '\n')
		}
	}
	msg := string(trimmed)
	if msg == "" {
		msg = http.StatusText(status)
	}
	b, _ := json.Marshal(Error{Type: "error", Error: ErrorDetail{Type: ErrorType(status), Message: msg}})
	return append(b, '\n')
}
