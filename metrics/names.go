package metrics

// Namespace prefixes every metric Switchyard exports.
const Namespace = "switchyard"

// Label names, in one place so dashboards, rules and code agree.
const (
	LabelModel      = "model"
	LabelWorkerType = "worker_type"
	LabelClass      = "class"
	LabelReason     = "reason"
	LabelWorker     = "worker"
	LabelRoute      = "route"
	LabelCode       = "code"
	LabelKind       = "kind"
	LabelResult     = "result"
	LabelPath       = "path"
	LabelRole       = "role"
)

// Worker roles of a disaggregated fleet, the LabelRole values (wire.RoleBoth,
// wire.RolePrefill, wire.RoleDecode).
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Roles lists the LabelRole values.
func Roles() []string { return []string{RoleBoth, RolePrefill, RoleDecode} }

// Full metric names. Rules (deploy/prometheus/rules.yml) and the Grafana
// dashboard use these strings. Every constant is the name of a collector some
// component registers (the package named per block); metrics/deploy_test.go
// checks that the deploy configuration names only these (or recording
// rules), and internal/app/metrics_names_test.go that a running replica
// exports every name the configuration reads.
const (
	// Admission (this package: NewAdmission).
	NameAdmissionReceived  = "switchyard_router_admission_received_total"
	NameAdmissionRejected  = "switchyard_router_admission_rejected_total"
	NameAdmissionAdmitted  = "switchyard_router_admission_admitted_total"
	NameAdmissionRetried   = "switchyard_router_admission_retried_total"
	NameAdmissionCancelled = "switchyard_router_admission_cancelled_total"
	NameQueueDepth         = "switchyard_router_queue_depth"
	NameQueuePendingTokens = "switchyard_router_queue_pending_tokens"
	NameQueueWait          = "switchyard_router_queue_wait_seconds"
	NameDecision           = "switchyard_router_admission_decision_seconds"
	NameDegradedAdmissions = "switchyard_router_degraded_admissions_total"

	// Disaggregated prefill and decode (frontend: newDisaggMetrics).
	NameDisaggDecisions  = "switchyard_router_disagg_decisions_total"
	NameDisaggRecomputes = "switchyard_router_disagg_recomputes_total"
	NameDisaggPrefillLeg = "switchyard_router_disagg_prefill_leg_seconds"
	NameDisaggTransfer   = "switchyard_router_disagg_transfer_predicted_seconds"
	NameDisaggLegErrors  = "switchyard_router_disagg_leg_errors_total"

	// Requests, streams and worker load (this package: NewRouter).
	NameTTFT                  = "switchyard_router_ttft_seconds"
	NameITL                   = "switchyard_router_itl_seconds"
	NameE2E                   = "switchyard_router_e2e_seconds"
	NamePromptTokens          = "switchyard_router_prompt_tokens_total"
	NameGeneratedTokens       = "switchyard_router_generated_tokens_total"
	NameCachedTokens          = "switchyard_router_cached_tokens_total"
	NamePredictedCachedTokens = "switchyard_router_predicted_cached_tokens_total"
	NameWorkerActiveRequests  = "switchyard_router_worker_projected_active_requests"
	NameWorkerPrefillTokens   = "switchyard_router_worker_projected_prefill_tokens"
	NameWorkerDecodeBlocks    = "switchyard_router_worker_projected_decode_blocks"
	// The projected load summed over the workers of each role (LabelRole),
	// and how many workers of the role are registered.
	NameRoleActiveRequests = "switchyard_router_role_projected_active_requests"
	NameRolePrefillTokens  = "switchyard_router_role_projected_prefill_tokens"
	NameRoleDecodeBlocks   = "switchyard_router_role_projected_decode_blocks"
	NameRoleWorkers        = "switchyard_router_role_workers"
	// The engine's own load as the worker (or its adapter) last reported it.
	NameWorkerEngineRunning       = "switchyard_router_worker_engine_running"
	NameWorkerEngineWaiting       = "switchyard_router_worker_engine_waiting"
	NameWorkerEngineKVUsage       = "switchyard_router_worker_engine_kv_usage"
	NameWorkerEnginePrefixHitRate = "switchyard_router_worker_engine_prefix_hit_rate"
	NameDegradedMode              = "switchyard_router_degraded_mode"
	NameHTTPResponses             = "switchyard_http_responses_total"

	// Routing quality (this package: NewRouting, built by NewRouter): per
	// decision, reachable, achieved and realised cached prompt tokens, and
	// the reasons one falls below the one before (routing.go).
	NameRouterDecisions               = "switchyard_router_decisions_total"
	NameRouterDecisionKVOptimal       = "switchyard_router_decision_kv_optimal_total"
	NameRouterDecisionReachableTokens = "switchyard_router_decision_reachable_tokens_total"
	NameRouterDecisionAchievedTokens  = "switchyard_router_decision_achieved_tokens_total"
	NameRouterDecisionRealisedTokens  = "switchyard_router_decision_realised_tokens_total"
	NameRouterDecisionRealisedReports = "switchyard_router_decision_realised_reports_total"
	NameRouterDecisionMissedTokens    = "switchyard_router_decision_missed_tokens_total"
	NameRouterDecisionLostTokens      = "switchyard_router_decision_lost_tokens_total"
	NameRouterDecisionShortfalls      = "switchyard_router_decision_shortfalls_total"

	// Tokenization (prompt.NewRegistry): which path turned each request's
	// prompt into token ids.
	NameRouterTokenize = "switchyard_router_tokenize_total"
	// Anthropic Messages API (frontend/messages.go): requests refused as
	// invalid by reason, attempts by forward path (native, translated).
	NameRouterMessagesInvalid   = "switchyard_router_messages_invalid_total"
	NameRouterMessagesForwarded = "switchyard_router_messages_forwarded_total"

	// Remote admission between replicas (admission/metrics.go): the
	// switchyard_admission_* metrics, each constant named after its metric
	// (unlike the router's admission counters above).
	NameAdmissionRemoteSeconds      = "switchyard_admission_remote_seconds"
	NameAdmissionEntryRetries       = "switchyard_admission_entry_retries_total"
	NameAdmissionEntryRejected      = "switchyard_admission_entry_rejected_total"
	NameAdmissionStaleGrants        = "switchyard_admission_stale_grants_total"
	NameAdmissionDegraded           = "switchyard_admission_degraded"
	NameAdmissionDegradedAdmissions = "switchyard_admission_degraded_admissions_total"
	NameAdmissionEtcdDegraded       = "switchyard_admission_etcd_degraded"
	NameAdmissionInflightBookings   = "switchyard_admission_inflight_bookings"
	NameAdmissionRenewals           = "switchyard_admission_renewals_total"
	NameAdmissionAdoptedBookings    = "switchyard_admission_adopted_bookings_total"
	NameAdmissionRehomedBookings    = "switchyard_admission_rehomed_bookings_total"
	NameAdmissionHeldForAdoption    = "switchyard_admission_held_for_adoption_total"
	NameAdmissionAdoptHolds         = "switchyard_admission_adopt_holds_total"
	// Degraded admissions by quota policy (docs/policy.md, "degraded").
	NameAdmissionDegradedQuotaAdmissions = "switchyard_admission_degraded_quota_admissions_total"
	NameAdmissionDegradedQuotaRejections = "switchyard_admission_degraded_quota_rejections_total"
	NameAdmissionBucketSyncErrors        = "switchyard_admission_bucket_sync_errors_total"

	// Capacity leasing of tenant quotas (admission/quota*.go).
	NameAdmissionQuotaAcquires      = "switchyard_admission_quota_acquires_total"
	NameAdmissionQuotaLeaseRequests = "switchyard_admission_quota_lease_requests_total"
	NameAdmissionQuotaGrants        = "switchyard_admission_quota_grants_total"
	NameAdmissionQuotaRecalls       = "switchyard_admission_quota_recalls_total"
	NameAdmissionQuotaFallbacks     = "switchyard_admission_quota_fallbacks_total"

	NameAdmissionDecodeErrors   = "switchyard_admission_decode_errors_total"
	NameAdmissionStaleLifeMarks = "switchyard_admission_stale_life_marks_total"
	// NameAdmissionCancelledGrants counts grants withdrawn because their
	// cancel had overtaken their admit request (admission/cancelled.go).
	NameAdmissionCancelledGrants = "switchyard_admission_cancelled_grants_total"
	// NameAdmissionStatusProbes counts the status probes an entry sent
	// about attempts that had no answer, by result; NameAdmissionStatusAnswers
	// the probes an owner answered, by status.
	NameAdmissionStatusProbes  = "switchyard_admission_status_probes_total"
	NameAdmissionStatusAnswers = "switchyard_admission_status_answers_total"
	NameClusterAcquireErrors   = "switchyard_cluster_ownership_acquire_errors_total"

	// KV index (kvindex/metrics.go).
	NameIndexBlocks           = "switchyard_index_blocks"
	NameIndexBytes            = "switchyard_index_bytes"
	NameIndexPredictedEntries = "switchyard_index_predicted_entries"
	NameIndexEventsApplied    = "switchyard_index_events_applied_total"
	NameIndexDecodeErrors     = "switchyard_index_decode_errors_total"
	NameIndexGaps             = "switchyard_index_event_gaps_total"
	NameIndexSampleMismatch   = "switchyard_index_sample_mismatch_total"
	NameIndexDumps            = "switchyard_index_dumps_total"
	NameIndexEventLag         = "switchyard_index_event_lag_seconds"
	// NameRouterKVSilentWorkers counts workers that publish KV events yet
	// whose computed prompt blocks never reached the index (docs/troubleshooting.md).
	NameRouterKVSilentWorkers = "switchyard_router_kv_silent_workers"

	// etcd session, registries and class ownership (cluster/; ClassOwned:
	// internal/app, from the ownership view).
	NameClusterSessionHealthy        = "switchyard_cluster_session_healthy"
	NameClusterSessionRenewals       = "switchyard_cluster_session_renewals_total"
	NameClusterSessionLeases         = "switchyard_cluster_session_leases_total"
	NameClusterSessionLeasesLost     = "switchyard_cluster_session_leases_lost_total"
	NameClusterClassesOwned          = "switchyard_cluster_classes_owned"
	NameClusterClassOwned            = "switchyard_cluster_class_owned"
	NameClusterHandoffs              = "switchyard_cluster_handoffs_total"
	NameClusterOwnershipAcquisitions = "switchyard_cluster_ownership_acquisitions_total"
	NameClusterOwnershipLosses       = "switchyard_cluster_ownership_losses_total"
	NameClusterRegistrySize          = "switchyard_cluster_registry_size"
	NameClusterWatchRelists          = "switchyard_cluster_watch_relists_total"
	NameClusterDecodeErrors          = "switchyard_cluster_decode_errors_total"

	// memberlist gossip (gossip/metrics.go).
	NameGossipMembers               = "switchyard_gossip_members"
	NameGossipHealthScore           = "switchyard_gossip_health_score"
	NameGossipDepartingOrigins      = "switchyard_gossip_departing_origins"
	NameGossipPropagationLag        = "switchyard_gossip_propagation_lag_seconds"
	NameGossipMessageBytes          = "switchyard_gossip_message_bytes"
	NameGossipStateBytes            = "switchyard_gossip_state_bytes"
	NameGossipBroadcastBytes        = "switchyard_gossip_broadcast_bytes_total"
	NameGossipBroadcastQueue        = "switchyard_gossip_broadcast_queue"
	NameGossipRelayedMessages       = "switchyard_gossip_relayed_messages_total"
	NameGossipTransportSentBytes    = "switchyard_gossip_transport_sent_bytes_total"
	NameGossipDroppedMessages       = "switchyard_gossip_dropped_messages_total"
	NameGossipDecodeErrors          = "switchyard_gossip_decode_errors_total"
	NameGossipJoinFailures          = "switchyard_gossip_join_failures_total"
	NameGossipMemberlistLogMessages = "switchyard_gossip_memberlist_log_messages_total"
	NameGossipFetches               = "switchyard_gossip_fetches_total"
	NameGossipFetchedEntries        = "switchyard_gossip_fetched_entries_total"

	// The high-water exporter's own health (this package: NewExporter).
	NameExporterSnapshots         = "switchyard_metrics_admission_snapshots_total"
	NameExporterInstances         = "switchyard_metrics_admission_instances"
	NameExporterCounterRegression = "switchyard_metrics_admission_counter_regressions_total"
)

// Rejection reasons, matching the scheduler's Reason.String() values. Every
// reason series is created at zero when a class is first seen, so rates and
// ratios exist before the first rejection (predicted_miss stays zero until a
// predictor exists).
const (
	ReasonDueTimePassed     = "due_time_passed"
	ReasonPredictedMiss     = "predicted_miss"
	ReasonQueueFull         = "queue_full"
	ReasonNoEndpoints       = "no_endpoints"
	ReasonOverloaded        = "overloaded"
	ReasonOwnershipLost     = "ownership_lost"
	ReasonInvalidConstraint = "invalid_constraint"
	ReasonUnknownClass      = "unknown_class"
	ReasonQuotaExceeded     = "quota_exceeded"
	// ReasonOther absorbs reason strings this package does not know, so a
	// producer bug cannot create unbounded series.
	ReasonOther = "other"
)

// rejectReasons lists every reason label value in export order. ReasonOther
// must stay last (reasonIndex relies on it). An array, so its length is a
// constant that sizes the exporter's per-class mark arrays.
var rejectReasons = [...]string{
	ReasonDueTimePassed, ReasonPredictedMiss, ReasonQueueFull, ReasonNoEndpoints,
	ReasonOverloaded, ReasonOwnershipLost, ReasonInvalidConstraint, ReasonUnknownClass,
	ReasonQuotaExceeded, ReasonOther,
}

const numReasons = len(rejectReasons)

// RejectReasons returns every reason label value, in export order.
func RejectReasons() []string { return append([]string(nil), rejectReasons[:]...) }

// Reason returns r if it is a known rejection reason, else ReasonOther.
func Reason(r string) string { return rejectReasons[reasonIndex(r)] }

func reasonIndex(r string) int {
	for i, k := range rejectReasons {
		if r == k {
			return i
		}
	}
	return numReasons - 1
}

// HTTP route label values of switchyard_http_responses_total: one per handler
// the frontend instruments (frontend/server.go), so raw URL paths never become
// labels; every other path counts as RouteOther. /metrics is not counted.
const (
	RouteChatCompletions = "chat_completions"
	RouteCompletions     = "completions"
	RouteEmbeddings      = "embeddings"
	RouteResponses       = "responses"
	RouteModels          = "models"
	RouteHealthz         = "healthz"
	RouteReadyz          = "readyz"
	RouteDebugCluster    = "debug_cluster"
	RouteOther           = "other"
)

// Route label values of Anthropic's Messages API (frontend/messages.go).
const (
	RouteMessages            = "messages"
	RouteMessagesCountTokens = "messages_count_tokens"
)

// Histogram buckets, in seconds. Each set spans the range its quantity
// realistically takes, with roughly 2-2.5x steps so p50/p99 interpolation
// stays within one step of the true value.
var (
	// BucketsQueueWait covers an uncontended same-turn admit (sub-millisecond)
	// up to a request that waited out a long deadline.
	BucketsQueueWait = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	// BucketsDecision covers one actor decision: microseconds when healthy.
	BucketsDecision = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3}
	// BucketsTTFT covers a cached short prompt (milliseconds) to a long
	// prefill behind a queue (a minute).
	BucketsTTFT = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// BucketsITL covers one decode step: milliseconds to about a second.
	BucketsITL = []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28}
	// BucketsE2E covers a whole request: tens of milliseconds to minutes.
	BucketsE2E = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}
	// BucketsLag covers propagation delays (KV events, gossip): a millisecond
	// on loopback to tens of seconds when a link is struggling.
	BucketsLag = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
)

// One-sided faults (docs/architecture.md, "Failures"): an owner that
// answers "no responders" (admission/metrics.go) and a router that
// withdrew from class placement because NATS is unreachable
// (internal/app/membership.go).
const (
	NameAdmissionOwnerUnreachableAdmissions = "switchyard_admission_owner_unreachable_admissions_total"
	NameAdmissionUnreachableOwners          = "switchyard_admission_unreachable_owners"
	NameRouterNATSWithdrawn                 = "switchyard_router_nats_withdrawn"
	NameRouterNATSWithdrawals               = "switchyard_router_nats_withdrawals_total"
)
