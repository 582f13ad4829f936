package prompt

import "errors"

// Sentinel errors, wrapped with context.
var (
	// ErrBadRequest is wrapped by every *RequestError: the client's prompt
	// is malformed.
	ErrBadRequest = errors.New("prompt: bad request")
	// ErrBadSpec is a tokenizer spec or a tokenizers map entry that cannot
	// be used (syntax, unknown encoding, unreadable files).
	ErrBadSpec = errors.New("prompt: bad tokenizer spec")
	// ErrDigest is a fetched tokenizer whose SHA-256 differs from the one
	// its worker advertised: it is refused.
	ErrDigest = errors.New("prompt: tokenizer digest mismatch")
	// ErrFetch is a failed download of advertised tokenizer files.
	ErrFetch = errors.New("prompt: fetch tokenizer")
	// ErrEngine is a failed tokenization by an engine's /tokenize.
	ErrEngine = errors.New("prompt: engine tokenize")
	// ErrRender is a chat template that failed on a request (the template
	// raised, or the messages did not fit it). It is the client's problem
	// as often as not; the frontend answers 400 with the message.
	ErrRender = errors.New("prompt: render chat")
)

// RequestError is a malformed prompt: Param names the field ("messages[2]
// .content", "prompt[1]"), Code is an OpenAI-style error code.
type RequestError struct {
	Param, Code, Message string
}

func (e *RequestError) Error() string { return "prompt: " + e.Param + ": " + e.Message }

// Unwrap makes errors.Is(err, ErrBadRequest) hold.
func (e *RequestError) Unwrap() error { return ErrBadRequest }

func badField(param, code, msg string) *RequestError {
	return &RequestError{Param: param, Code: code, Message: msg}
}
