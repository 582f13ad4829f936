// Package anthropic is Anthropic's Messages API as Switchyard serves it:
// the request and response wire types, their validation, and the
// translation to and from OpenAI's chat completions for engines that serve
// only those.
//
// The translation follows vLLM's own Messages front end (its
// entrypoints/anthropic serving code), so a request tokenized here for
// routing renders to the prompt vLLM renders when it serves /v1/messages
// itself: the system prompt becomes the first system message, content
// blocks become chat content parts, tool_use blocks the assistant's
// tool_calls and tool_result blocks tool messages. docs/api.md lists what
// is translated and what is not.
package anthropic
