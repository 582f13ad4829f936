package prompt

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/zeebo/xxh3"

	"github.com/switchyard/switchyard/tokenizer"
)

// turnEncoder tokenizes the plain chats of a template that renders message
// by message (the built-in ChatML, Llama 3's) turn by turn: a next turn of
// a conversation the cache holds renders, scans and hashes only its new
// messages, instead of the whole history (tokenizer.Model.EncodeTurns). It
// is used only where the tokenizer proves that its encoding splits between
// every two rendered messages (tokenizer.Model.Joint); other chats, and
// other templates, render whole and go through EncodeCached.
//
// The cache keys are a chain hash of the messages' roles and contents (what
// the template renders of them; plain contents alias the request body), so
// the history is hashed once, in a pass over the body's bytes, and never
// rendered again. The hash is seeded per process, so a client cannot craft
// a collision with another conversation's prefix.
type turnEncoder struct {
	tok   *tokenizer.Model
	cache *tokenizer.PrefixCache
	joint tokenizer.Joint
	ct    *chatTemplate
	// hasher is the seeded hasher each encode starts from (a copy: the
	// secret derived from the seed is shared and only read).
	hasher *xxh3.Hasher
}

// newTurnEncoder returns the turn encoder of ct over tok, or nil when ct is
// not a template it knows renders message by message, or tok does not
// split where that template joins two messages.
func newTurnEncoder(tok *tokenizer.Model, cache *tokenizer.PrefixCache, ct *chatTemplate) *turnEncoder {
	var left, right string
	switch {
	case ct.builtinChatML:
		left, right = "<|im_end|>\n", "<|im_start|>"
	case ct.llama3BOS != nil:
		left, right = llama3EOT, llama3Header
	default:
		return nil
	}
	j, ok := tok.Joint(left, right)
	if !ok {
		return nil
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:]) // never fails (crypto/rand's contract)
	return &turnEncoder{tok: tok, cache: cache, joint: j, ct: ct, hasher: xxh3.NewSeed(binary.LittleEndian.Uint64(seed[:]) | 1)}
}

// maxStackTurns is how many messages' keys encode keeps on its stack.
const maxStackTurns = 64

// encode returns in's ids, equal to those of its rendering, and false when
// in is not a chat it encodes turn by turn (the caller renders it whole).
// The ids' Head is shared with the cache: read only.
func (e *turnEncoder) encode(in *Input) (tokenizer.IDs, bool) {
	if in.ContinueFinalMessage || !plainChat(in) {
		return tokenizer.IDs{}, false
	}
	var buf [maxStackTurns]uint64
	keys := buf[:0]
	if len(in.Messages) > maxStackTurns {
		keys = make([]uint64, 0, len(in.Messages))
	}
	h := *e.hasher
	var n [8]byte
	for i := range in.Messages {
		m := &in.Messages[i]
		binary.LittleEndian.PutUint64(n[:], uint64(len(m.Role)))
		_, _ = h.Write(n[:])
		_, _ = h.WriteString(m.Role)
		binary.LittleEndian.PutUint64(n[:], uint64(len(m.Content)))
		_, _ = h.Write(n[:])
		_, _ = h.WriteString(m.Content)
		keys = append(keys, h.Sum64())
	}
	turn, tail := e.appendChatMLTurn, ""
	if e.ct.builtinChatML {
		if in.AddGenerationPrompt {
			tail = chatMLGeneration
		}
	} else {
		turn = e.ct.appendLlama3Turn
		if in.AddGenerationPrompt {
			tail = llama3Generation
		}
	}
	return e.tok.EncodeTurnsIDs(e.cache, e.joint, keys, func(i int, dst []byte) []byte {
		return turn(dst, i, &in.Messages[i])
	}, tail)
}

func (e *turnEncoder) appendChatMLTurn(b []byte, _ int, m *Message) []byte {
	return appendChatMLTurn(b, m)
}
