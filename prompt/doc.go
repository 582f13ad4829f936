// Package prompt turns an OpenAI request into the model's token ids, the
// ids the model's engines compute, so a router's prefix hashes match their
// KV caches (design §13). It owns:
//
//   - the request forms (Parse): completions prompts (a string, token ids,
//     or a batch of either), chat messages with content parts (text parts
//     joined with "\n" as vLLM's chat_utils joins them; every non-text part
//     — image_url, input_audio, video_url, file, input_image, ... — replaced
//     for hashing by Placeholder, a text derived from the part's hash, while
//     the part itself reaches the engine untouched), tools and tool calls,
//     /v1/embeddings input and /v1/responses input items;
//   - the per-model registry (Registry): which tokenizer a served model name
//     uses — from -tokenizer flags, the policy file's tokenizers map, or its
//     workers' registrations (a built-in spec, or files fetched from an
//     adapter and checked against their advertised SHA-256);
//   - the fallbacks when a model has none: asking one of its engines (vLLM's
//     POST /tokenize, with a short timeout and a bounded LRU keyed by a hash
//     of the prompt part), then approximate pseudo-tokens (one per 4 bytes of
//     the rendered text) that route by predictions only;
//   - switchyard_router_tokenize_total{model,path}, which path served;
//   - ScanObject and ScanArray, the one-pass validating JSON scanner that
//     request bodies and messages are split with (values alias the body);
//     whatever it cannot vouch for is decoded with encoding/json instead,
//     so values and error messages are encoding/json's.
//
// Chats of plain messages (role and string content, no tools or kwargs)
// skip the Jinja evaluator for two templates whose output is simple: the
// built-in ChatML and Meta Llama 3's (recognised byte for byte); the text is
// written directly, and TestBuiltinChatMLFastPathRendersAsTheTemplate and
// TestLlama3FastPathRendersAsTheTemplate hold it equal to the template's.
//
// With those two templates, a plain chat is also tokenized turn by turn
// when the model has a prefix cache (turnEncoder): the cache is keyed by a
// seeded chain hash of the messages' roles and contents, so a
// conversation's next turn renders and encodes only its new messages. The
// tokenizer proves first that its encoding splits between two rendered
// messages (tokenizer.Model.Joint); TestTurnByTurnTokensEqualTheWholeRendering
// and its fuzz test hold the ids equal to encoding the whole rendering.
// Such a Result holds its cached history uncopied (Result.IDs, in two
// parts), and Result.SequenceHashes remembers the history's block hashes
// beside it in the cache, so a next turn hashes only its new blocks
// (TestTurnByTurnBlockHashesEqualHashingTheWholeRendering).
//
// BOS follows vLLM: chat prompts are tokenized without adding special
// tokens (the template writes BOS), text prompts get the tokenizer's BOS
// when it adds one and the request does not say add_special_tokens=false;
// token-id prompts are used as they are.
//
// References read (facts, not code): vLLM's
// vllm/entrypoints/serve/tokenize/protocol.py and api_router.py (the
// /tokenize request and response fields), vllm/entrypoints/chat_utils.py
// (text parts joined with "\n"; tool_calls arguments parsed from JSON
// strings into objects, empty tool_calls dropped, before the template).
// Messages and tools reach templates rebuilt as vLLM rebuilds them
// (tokenizer/chat's VLLMMessages, VLLMTools and ContentFormat), with the
// placeholders above standing for media parts.
//
// Concurrency: Tokenize, Model and Info are safe for concurrent use and
// never block on loading: the resolved model map is an immutable snapshot
// behind an atomic pointer, replaced whole when a tokenizer is loaded or the
// configuration changes. Run is the one goroutine that loads policy specs
// and fetches advertised files; NewRegistry starts nothing and loads the
// flag-configured tokenizers itself (a bad one is a startup error).
package prompt
