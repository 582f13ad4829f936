package listflag

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplitTrimsItemsAndDropsEmptyOnes(t *testing.T) {
	assert.Equal(t, []string{"a", "b", "c"}, Split(" a, b,,c ,"))
	assert.Nil(t, Split(""))
	assert.Nil(t, Split(" , "))
}
