package enginekv

// Metric names this package registers. They are not in metrics/names.go,
// which lists the names the deploy configuration reads; none of these is
// read there yet.
const (
	// Subscriber (the adapter side).
	NameFrames        = "switchyard_adapter_zmq_frames_total"  // result
	NameReplays       = "switchyard_adapter_zmq_replays_total" // result
	NameResets        = "switchyard_adapter_zmq_resets_total"  // reason
	NameUnknownEvents = "switchyard_adapter_zmq_unknown_events_total"
	NameBatches       = "switchyard_adapter_zmq_batches_total"
	NameEvents        = "switchyard_adapter_zmq_events_total"

	// Publisher (the simulated engine in vLLM mode).
	NamePubBatches        = "switchyard_engine_zmq_batches_total"
	NamePubDropped        = "switchyard_engine_zmq_dropped_batches_total"
	NamePubReplayRequests = "switchyard_engine_zmq_replay_requests_total" // result
)
