package enginekv

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryMediumTheEnginesPublishParsesToItsTier(t *testing.T) {
	for in, want := range map[string]Medium{
		"": MediumGPU, "GPU": MediumGPU, "gpu": MediumGPU,
		"CPU": MediumCPU, "CPU_PINNED": MediumCPU, "cpu_pinned": MediumCPU,
		"DISK": MediumDisk, "EXTERNAL": MediumDisk, "disk": MediumDisk,
	} {
		got, err := ParseMedium(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
		again, err := ParseMedium(got.String())
		require.NoError(t, err)
		assert.Equal(t, got, again, "String round-trips")
	}
}

func TestAnUnknownMediumIsATypedErrorNotAGuess(t *testing.T) {
	for _, in := range []string{"NVME", "HBM", " GPU"} {
		_, err := ParseMedium(in)
		require.ErrorIs(t, err, ErrUnknownMedium, in)
		require.ErrorIs(t, err, ErrMalformed, in)
		assert.True(t, IsUnknownMedium(err))
	}
}

func TestADecodedEventNamesItsTier(t *testing.T) {
	b := Batch{DPRank: 1, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "CPU_PINNED"},
		{Kind: BlockRemoved, BlockHashes: []uint64{1}, Medium: "DISK"},
		{Kind: BlockRemoved, BlockHashes: []uint64{2}, Medium: "NVME"},
	}}
	for _, enc := range allEncodings {
		got, err := DecodeBatch(EncodeBatch(b, enc))
		require.NoError(t, err, "%+v", enc)
		require.Len(t, got.Events, 3)
		tier, err := got.Events[0].Tier()
		require.NoError(t, err)
		assert.Equal(t, MediumCPU, tier)
		tier, err = got.Events[1].Tier()
		require.NoError(t, err)
		assert.Equal(t, MediumDisk, tier)
		_, err = got.Events[2].Tier()
		require.ErrorIs(t, err, ErrUnknownMedium, "the batch decodes; only the event's tier is unknown")
		assert.Equal(t, 1, got.DPRank)
	}
}
