package endtoend

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// chatTurn is one exchange of a conversation through a gateway.
type chatTurn struct {
	served       string
	promptTokens int
	cachedTokens int
	answer       string
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// sendChat posts a chat completion to gateway g and reads the reply's
// served-by header and usage.
func sendChat(t *testing.T, s *stack.Stack, g int, msgs []chatMessage, maxTokens int) chatTurn {
	t.Helper()
	body := map[string]any{"model": stack.DefaultModel, "messages": msgs, "max_tokens": maxTokens}
	r := send(t, http.MethodPost, s.GatewayClientURL(g)+"/v1/chat/completions", body, nil)
	require.Equal(t, http.StatusOK, r.Status, r.String())
	var out struct {
		Choices []struct {
			Message chatMessage `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &out), r.String())
	turn := chatTurn{served: r.Header.Get(s.GatewayInfo(g).Router.ServedByHeader), promptTokens: out.Usage.PromptTokens}
	if d := out.Usage.PromptTokensDetails; d != nil {
		turn.cachedTokens = d.CachedTokens
	}
	if len(out.Choices) > 0 {
		turn.answer = out.Choices[0].Message.Content
	}
	return turn
}

func prefixStack(t *testing.T, routerPatch map[string]any, replicaArgs ...string) *stack.Stack {
	patch := map[string]any{"scheduler": map[string]any{"profile": "prefix-aware"}}
	for k, v := range routerPatch {
		patch[k] = v
	}
	return startStack(t, stack.Config{
		Gateways:    2,
		Replicas:    4,
		TimeScale:   20,
		RouterPatch: patch,
		ReplicaArgs: replicaArgs,
		// Prefix caching and cached_tokens are on by default in the
		// simulator, as with vLLM's --enable-prompt-tokens-details.
	})
}

// TestPrefixConversationSticksAcrossGateways: a multi-turn conversation
// sent alternately through two gateway replicas stays on one replica and
// is served from its cache from the second turn on; other conversations
// spread over the replicas.
func TestPrefixConversationSticksAcrossGateways(t *testing.T) {
	s := prefixStack(t, nil)
	require.NoError(t, s.WaitGatewayRouted(ctxTimeout(t), 1))

	msgs := []chatMessage{
		{Role: "system", Content: strings.Repeat("You are a careful SQL reviewer for the billing team. ", 30)},
		{Role: "user", Content: "Review: SELECT * FROM invoices WHERE paid = false;"},
	}
	var home string
	for turn := range 6 {
		got := sendChat(t, s, turn%2, msgs, 24)
		if turn == 0 {
			home = got.served
			require.NotEmpty(t, home)
		}
		assert.Equal(t, home, got.served, "turn %d (gateway %d) left the conversation's replica", turn, turn%2)
		if turn > 0 {
			assert.Greater(t, got.cachedTokens, 0, "turn %d reported no cached tokens", turn)
		}
		t.Logf("turn %d via gateway %d: %s, %d of %d prompt tokens cached", turn, turn%2, got.served, got.cachedTokens, got.promptTokens)
		msgs = append(msgs, chatMessage{Role: "assistant", Content: got.answer},
			chatMessage{Role: "user", Content: fmt.Sprintf("And what about query %d?", turn)})
	}

	// Different conversations spread: each starts with its own text.
	spread := map[string]int{}
	for c := range 16 {
		first := []chatMessage{{Role: "user", Content: fmt.Sprintf("Conversation %d: %s", c, strings.Repeat("explain this schema migration step by step. ", 10))}}
		spread[sendChat(t, s, c%2, first, 4).served]++
	}
	t.Logf("16 new conversations: %v", spread)
	assert.GreaterOrEqual(t, len(spread), 3, "16 conversations used %d of 4 replicas", len(spread))
}

// TestPrefixSaturationSpreads: once the replica holding a hot prefix has no
// capacity (the load guard), new requests with that prefix go elsewhere.
func TestPrefixSaturationSpreads(t *testing.T) {
	s := prefixStack(t, map[string]any{"scheduler": map[string]any{
		"profile": "sticky",
		"plugins": []any{map[string]any{"type": "prefix-affinity-filter", "name": "affinity", "parameters": map[string]any{"queueThreshold": 0, "kvCacheThreshold": 1}}},
		"profiles": map[string]any{"sticky": map[string]any{
			"filters": []string{"affinity"},
			"scorers": []any{map[string]any{"scorer": "queue-scorer", "weight": 1}, map[string]any{"scorer": "prefix-cache-scorer", "weight": 1}},
			"picker":  "max-score-picker",
		}},
	}}, "--max-num-seqs", "4")
	require.NoError(t, s.WaitGatewayRouted(ctxTimeout(t), 1))
	hot := []chatMessage{{Role: "system", Content: strings.Repeat("Shared policy text every assistant reads first. ", 40)}, {Role: "user", Content: "Q?"}}
	home := sendChat(t, s, 0, hot, 2).served

	// Fill the home replica's queue with long requests sharing the prefix.
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := append(append([]chatMessage(nil), hot[:1]...), chatMessage{Role: "user", Content: fmt.Sprintf("long question %d", i)})
			body := map[string]any{"model": stack.DefaultModel, "messages": m, "max_tokens": 2000}
			_, _ = trySend(ctxTimeout(t), http.MethodPost, s.GatewayClientURL(i%2)+"/v1/chat/completions", body, nil)
		}()
	}
	poll(t, func() bool { return replicaState(t, home).Waiting > 0 })
	waitPushes(t, s, 3)
	elsewhere := 0
	for i := range 10 {
		m := append(append([]chatMessage(nil), hot[:1]...), chatMessage{Role: "user", Content: fmt.Sprintf("new question %d", i)})
		if sendChat(t, s, i%2, m, 2).served != home {
			elsewhere++
		}
	}
	assert.GreaterOrEqual(t, elsewhere, 8, "with its replica saturated, only %d of 10 hot-prefix requests went elsewhere", elsewhere)
	wg.Wait()
}

// ctxTimeout is a context bounded by waitLong, cancelled at the test's end.
func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	t.Cleanup(cancel)
	return ctx
}
