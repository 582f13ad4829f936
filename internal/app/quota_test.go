package app

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/tenant"
)

// A tenant allowed three classes, owned by different replicas, has one
// concurrency quota across them (capacity leasing): with its 10 streams
// spread over the three classes and entering at the three replicas, the
// 11th request is 429 via every replica in every class. Without leasing
// each class's owner counted only its own streams and admitted it.
func TestATenantsConcurrencyQuotaHoldsAcrossItsClassesThroughTheCluster(t *testing.T) {
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    default_class: interactive
    classes: [batch, realtime]
    quota: {concurrent: 10}
`, tenant.HashKey("sk-acme")))
	_, reps := startHeldStreamsCluster(t, keys)
	owners := map[string]bool{}
	for _, class := range defaultClasses {
		owners[reps[0].status.Owners()[class].Replica] = true
	}
	require.Greater(t, len(owners), 1, "precondition: the classes have different owners: %v", reps[0].status.Owners())

	var ends []func()
	defer func() {
		for _, end := range ends {
			end()
		}
	}()
	for i := range 10 {
		class := defaultClasses[i%3]
		r := reps[(i/3+i)%3]
		ctx, cancel := context.WithCancel(context.Background())
		cl := keyedClient(r, "sk-acme")
		stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("held stream %d", i))},
			MaxTokens: openai.Int(20000),
		}, option.WithHeader("x-switchyard-class", class))
		if !stream.Next() {
			cancel()
			t.Fatalf("stream %d via %s in %s: %v", i, r.status.ID, class, stream.Err())
		}
		ends = append(ends, func() { cancel(); _ = stream.Close() })
	}
	for _, r := range reps {
		for _, class := range defaultClasses {
			cl := keyedClient(r, "sk-acme")
			_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("one too many via " + r.status.ID)},
				MaxTokens: openai.Int(2),
			}, option.WithHeader("x-switchyard-class", class))
			require.Error(t, err, "the 11th request via %s in %s must be refused", r.status.ID, class)
			status, code := apiStatus(t, err)
			require.Equal(t, http.StatusTooManyRequests, status, "via %s in %s", r.status.ID, class)
			require.Equal(t, "quota_exceeded", code)
		}
	}
}
