package app

// Anthropic's Messages API end to end: the official anthropic-sdk-go
// client against a real replica over real HTTP, in front of a simulated
// worker that serves /v1/messages itself (forwarded as sent) and one that
// serves only chat completions (translated both ways).

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestTheAnthropicClientIsServedThroughTheRouterByEnginesWithAndWithoutTheMessagesAPI(t *testing.T) {
	for _, tc := range []struct {
		name   string
		native bool
	}{{"an engine serving /v1/messages", true}, {"an engine serving only chat completions", false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := routerTestCluster(t)
			c.addWorker("w1", func(cfg *WorkerConfig) { cfg.Messages = tc.native })
			r := c.startOwner(1)
			addr := r.status.HTTPAddr
			cl := anthropic.NewClient(option.WithBaseURL("http://"+addr+"/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))

			textAnswersStreamingAndNot(t, cl)
			toolsRoundTrip(t, cl)
			countTokensMatchesTheEnginesPromptTokens(t, cl)

			want, other := "translated", "native"
			if tc.native {
				want, other = other, want
			}
			assert.Positive(t, metricSum(t, addr, "switchyard_router_messages_forwarded_total", map[string]string{"path": want}),
				"every attempt took the %s path", want)
			assert.Zero(t, metricSum(t, addr, "switchyard_router_messages_forwarded_total", map[string]string{"path": other}))
			assert.Positive(t, metricSum(t, addr, "switchyard_http_responses_total", map[string]string{"route": "messages", "code": "200"}))
		})
	}
}

func textAnswersStreamingAndNot(t *testing.T, cl anthropic.Client) {
	ctx := testenv.Context(t)
	params := anthropic.MessageNewParams{
		Model:     testModel,
		MaxTokens: 6,
		System:    []anthropic.TextBlockParam{{Text: "be brief"}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello there"))},
	}
	msg, err := cl.Messages.New(ctx, params)
	require.NoError(t, err)
	require.Len(t, msg.Content, 1)
	assert.Equal(t, "text", msg.Content[0].Type)
	assert.NotEmpty(t, msg.Content[0].Text)
	assert.Equal(t, anthropic.StopReasonMaxTokens, msg.StopReason, "the simulated engine stops at max_tokens: length is max_tokens")
	assert.Equal(t, int64(6), msg.Usage.OutputTokens)
	assert.Positive(t, msg.Usage.InputTokens+msg.Usage.CacheReadInputTokens)
	assert.True(t, strings.HasPrefix(msg.ID, "msg_"), msg.ID)

	stream := cl.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	var kinds []string
	for stream.Next() {
		ev := stream.Current()
		require.NoError(t, acc.Accumulate(ev))
		if len(kinds) == 0 || kinds[len(kinds)-1] != ev.Type {
			kinds = append(kinds, ev.Type)
		}
	}
	require.NoError(t, stream.Err())
	assert.Equal(t, []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}, kinds,
		"the Messages event sequence (pings aside: the SDK hides them)")
	require.Len(t, acc.Content, 1)
	assert.Equal(t, "text", acc.Content[0].Type)
	assert.NotEmpty(t, acc.Content[0].Text, "the text deltas assemble into the block's text")
	assert.Equal(t, anthropic.StopReasonMaxTokens, acc.StopReason)
	assert.Equal(t, int64(6), acc.Usage.OutputTokens)
	assert.Positive(t, acc.Usage.InputTokens+acc.Usage.CacheReadInputTokens)
}

func toolsRoundTrip(t *testing.T, cl anthropic.Client) {
	ctx := testenv.Context(t)
	tool := anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{
		Properties: map[string]any{"text": map[string]any{"type": "string"}},
		Required:   []string{"text"},
	}, "get_weather")
	first := anthropic.NewUserMessage(anthropic.NewTextBlock("what is the weather in Paris?"))
	stream := cl.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model:      testModel,
		MaxTokens:  5,
		Messages:   []anthropic.MessageParam{first},
		Tools:      []anthropic.ToolUnionParam{tool},
		ToolChoice: anthropic.ToolChoiceParamOfTool("get_weather"),
	})
	var call anthropic.Message
	jsonDeltas := 0
	for stream.Next() {
		ev := stream.Current()
		require.NoError(t, call.Accumulate(ev))
		if ev.Type == "content_block_delta" && ev.Delta.Type == "input_json_delta" {
			jsonDeltas++
		}
	}
	require.NoError(t, stream.Err())
	assert.Greater(t, jsonDeltas, 1, "the call's arguments stream as input_json_delta events")
	require.Len(t, call.Content, 1)
	use := call.Content[0]
	require.Equal(t, "tool_use", use.Type)
	assert.Equal(t, "get_weather", use.Name)
	assert.NotEmpty(t, use.ID)
	var input struct {
		Text string `json:"text"`
	}
	require.NoError(t, json.Unmarshal(use.Input, &input), "the streamed arguments assemble into a JSON object: %s", use.Input)
	assert.NotEmpty(t, input.Text)
	assert.Equal(t, anthropic.StopReasonToolUse, call.StopReason)

	whole, err := cl.Messages.New(ctx, anthropic.MessageNewParams{
		Model: testModel, MaxTokens: 5, Messages: []anthropic.MessageParam{first},
		Tools: []anthropic.ToolUnionParam{tool}, ToolChoice: anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{}},
	})
	require.NoError(t, err)
	require.Len(t, whole.Content, 1, "tool_choice any: the simulated engine calls the first tool")
	assert.Equal(t, "tool_use", whole.Content[0].Type)
	assert.Equal(t, "get_weather", whole.Content[0].Name)
	assert.True(t, json.Valid(whole.Content[0].Input), "%s", whole.Content[0].Input)
	assert.Equal(t, anthropic.StopReasonToolUse, whole.StopReason)

	answer, err := cl.Messages.New(ctx, anthropic.MessageNewParams{
		Model:     testModel,
		MaxTokens: 4,
		Messages: []anthropic.MessageParam{first, call.ToParam(),
			anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "sunny, 21 degrees", false))},
		Tools: []anthropic.ToolUnionParam{tool},
	})
	require.NoError(t, err)
	require.Len(t, answer.Content, 1)
	assert.Equal(t, "text", answer.Content[0].Type, "the tool's result is answered with text")
	assert.NotEmpty(t, answer.Content[0].Text)
	assert.Equal(t, int64(4), answer.Usage.OutputTokens)
	assert.Greater(t, answer.Usage.InputTokens+answer.Usage.CacheReadInputTokens, call.Usage.InputTokens+call.Usage.CacheReadInputTokens,
		"the second turn's prompt holds the first, the call and its result")
}

func countTokensMatchesTheEnginesPromptTokens(t *testing.T, cl anthropic.Client) {
	ctx := testenv.Context(t)
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("count these tokens, please"))}
	count, err := cl.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: testModel, Messages: msgs})
	require.NoError(t, err)
	msg, err := cl.Messages.New(ctx, anthropic.MessageNewParams{Model: testModel, MaxTokens: 1, Messages: msgs})
	require.NoError(t, err)
	assert.Equal(t, msg.Usage.InputTokens+msg.Usage.CacheReadInputTokens, count.InputTokens,
		"the router counts the prompt the engine renders and tokenizes")
}

func TestBadMessagesRequestsGetAnthropicsErrorShapeAndAreCounted(t *testing.T) {
	c := routerTestCluster(t)
	c.addWorker("w1", nil)
	r := c.startOwner(1)
	addr := r.status.HTTPAddr
	for _, tc := range []struct {
		name, body, reason string
		status             int
		errType            string
	}{
		{"malformed JSON", `{"model":`, "invalid_json", 400, "invalid_request_error"},
		{"a missing max_tokens", `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}]}`, "missing_required_parameter", 400, "invalid_request_error"},
		{"an unknown content block type", `{"model":"` + testModel + `","max_tokens":4,"messages":[{"role":"user","content":[{"type":"hologram"}]}]}`, "invalid_value", 400, "invalid_request_error"},
		{"a model nobody serves", `{"model":"nope","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "", 404, "not_found_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(testenv.Context(t), http.MethodPost, "http://"+addr+"/v1/messages", strings.NewReader(tc.body))
			require.NoError(t, err)
			req.Header.Set("anthropic-version", "2023-06-01")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, tc.status, resp.StatusCode, "%s", body)
			assert.NotEmpty(t, resp.Header.Get("request-id"))
			assert.Equal(t, "2023-06-01", resp.Header.Get("anthropic-version"))
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(body, &e), "%s", body)
			assert.Equal(t, "error", e.Type)
			assert.Equal(t, tc.errType, e.Error.Type)
			assert.NotEmpty(t, e.Error.Message)
			if tc.reason != "" {
				assert.Equal(t, 1.0, metricSum(t, addr, "switchyard_router_messages_invalid_total", map[string]string{"reason": tc.reason}))
			}
		})
	}

	cl := anthropic.NewClient(option.WithBaseURL("http://"+addr+"/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	_, err := cl.Messages.New(testenv.Context(t), anthropic.MessageNewParams{Model: "nope", MaxTokens: 4,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var apiErr *anthropic.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	assert.Equal(t, http.StatusNotFound, apiErr.StatusCode)
	assert.NotEmpty(t, apiErr.RequestID, "the SDK reads the request-id header")
}
