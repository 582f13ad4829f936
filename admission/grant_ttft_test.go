package admission

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

func TestARemoteGrantCarriesTheOwnersTTFTPrediction(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	a, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 7)

	local, err := a.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err)
	remote, err := b.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err)
	require.Positive(t, local.Grant().PredictedTTFT, "the owner's own grant carries the selector's prediction")
	require.Positive(t, remote.Grant().PredictedTTFT, "so does the grant it sends over NATS")
	for _, tk := range []*Ticket{local, remote} {
		tk.Dispatched()
		tk.Finish(false)
	}
}
