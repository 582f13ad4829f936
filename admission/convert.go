package admission

import (
	"time"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// RequestToWire converts a request for the admit subject.
func RequestToWire(r *scheduler.Request, entry string) *wire.AdmitRequest {
	out := &wire.AdmitRequest{
		ID: r.ID, Class: r.Class, Entry: entry, Attempt: r.Attempt,
		StrictPriority: r.StrictPriority, PriorityJump: r.PriorityJump,
		IngressUnixNano: r.Ingress.UnixNano(),
		PromptTokens:    r.PromptTokens, BlockHashes: r.BlockHashes,
		Pinned: r.Pinned, Allowed: r.Allowed, ExpectedOutput: r.ExpectedOutputTokens,
		OutputBound: r.OutputBound, Sequences: r.Sequences,
	}
	if !r.Due.IsZero() {
		out.DueUnixNano = r.Due.UnixNano()
	}
	if tn := r.Tenant; tn.ID != "" {
		out.Tenant, out.TenantWeight = tn.ID, min(max(tn.Weight, 0), wire.MaxTenantWeight)
		if q := tn.Quota; q != (scheduler.TenantQuota{}) {
			out.TenantQuota = &wire.AdmitQuota{Concurrent: q.Concurrent, RequestsPerMinute: q.RequestsPerMinute, TokensPerMinute: q.TokensPerMinute}
		}
	}
	if a := r.Session; a.Worker != "" {
		out.Session = &wire.AdmitSession{Worker: a.Worker, Hard: a.Hard, MarginRatio: a.MarginRatio, MarginCost: a.MarginCost}
	}
	for _, sq := range r.SizedHashes {
		out.SizedBlocks = append(out.SizedBlocks, wire.AdmitBlocks{BlockSize: sq.BlockSize, Hashes: sq.Hashes})
	}
	if len(r.Overlaps) > 0 {
		out.Overlaps = make([]wire.AdmitOverlap, len(r.Overlaps))
		for i, o := range r.Overlaps {
			out.Overlaps[i] = wire.AdmitOverlap{Worker: o.Worker, Blocks: o.Blocks}
		}
	}
	return out
}

// RequestFromWire is the inverse of RequestToWire.
func RequestFromWire(in *wire.AdmitRequest) *scheduler.Request {
	r := &scheduler.Request{
		ID: in.ID, Class: in.Class, Attempt: in.Attempt,
		StrictPriority: in.StrictPriority, PriorityJump: in.PriorityJump,
		Ingress:      time.Unix(0, in.IngressUnixNano),
		PromptTokens: in.PromptTokens, BlockHashes: in.BlockHashes,
		Pinned: in.Pinned, Allowed: in.Allowed, ExpectedOutputTokens: in.ExpectedOutput,
		OutputBound: in.OutputBound, Sequences: in.Sequences,
	}
	if in.DueUnixNano != 0 {
		r.Due = time.Unix(0, in.DueUnixNano)
	}
	if in.Tenant != "" {
		r.Tenant = scheduler.Tenant{ID: in.Tenant, Weight: in.TenantWeight}
		if q := in.TenantQuota; q != nil {
			r.Tenant.Quota = scheduler.TenantQuota{Concurrent: q.Concurrent, RequestsPerMinute: q.RequestsPerMinute, TokensPerMinute: q.TokensPerMinute}
		}
	}
	if a := in.Session; a != nil {
		r.Session = scheduler.SessionAffinity{Worker: a.Worker, Hard: a.Hard, MarginRatio: a.MarginRatio, MarginCost: a.MarginCost}
	}
	for _, sq := range in.SizedBlocks {
		r.SizedHashes = append(r.SizedHashes, scheduler.BlockSequence{BlockSize: sq.BlockSize, Hashes: sq.Hashes})
	}
	if len(in.Overlaps) > 0 {
		r.Overlaps = make([]scheduler.Overlap, len(in.Overlaps))
		for i, o := range in.Overlaps {
			r.Overlaps[i] = scheduler.Overlap{Worker: o.Worker, Blocks: o.Blocks}
		}
	}
	return r
}

// grantFromReply rebuilds the grant or the typed rejection of a reply.
func grantFromReply(in *wire.AdmitReply, requestID string) (scheduler.Grant, error) {
	if !in.OK {
		reason, err := scheduler.ParseReason(in.Reason)
		if err != nil {
			reason = scheduler.ReasonOverloaded
		}
		return scheduler.Grant{}, &scheduler.RejectError{Reason: reason, Limit: in.Limit, Detail: in.Detail,
			RetryAfter: time.Duration(in.RetryAfterMs) * time.Millisecond}
	}
	// An unknown shortfall label (a newer owner) reads as none: the
	// figures are diagnostics, never a reason to fail a grant.
	short, _ := scheduler.ParseShortfall(in.Shortfall)
	g := scheduler.Grant{
		RequestID: requestID, Worker: in.Worker, WorkerURL: in.WorkerURL,
		Booking:      scheduler.BookingID(in.Booking),
		CachedTokens: in.CachedTokens, TierCreditTokens: in.TierCredit, OverlapBlocks: in.OverlapBlocks, BlockSize: in.BlockSize,
		QueueWait:       time.Duration(in.QueueWaitNano),
		ReachableTokens: max(in.Reachable, in.CachedTokens), Shortfall: short,
		PredictedTTFT: time.Duration(max(in.PredictedTTFTNano, 0)),
	}
	decodeFromWire(in, &g)
	for _, c := range in.Candidates[:min(len(in.Candidates), scheduler.MaxGrantCandidates)] {
		g.Candidates[g.NumCandidates] = scheduler.GrantCandidate{Worker: c.Worker, CachedTokens: c.CachedTokens, PredictedTTFT: time.Duration(c.PredictedTTFTNano)}
		g.NumCandidates++
	}
	return g, nil
}

func recordToWire(rec *scheduler.BookingRecord) wire.AdoptedBooking {
	return wire.AdoptedBooking{
		RequestID: rec.RequestID, Worker: rec.Worker, BlockHashes: rec.BlockHashes,
		PromptTokens: rec.PromptTokens, CachedTokens: rec.CachedTokens, TierCredit: rec.TierCreditTokens,
		ExpectedOutput: rec.ExpectedOutputTokens, Sequences: rec.Sequences, FirstTokenSeen: rec.FirstTokenSeen, Tenant: rec.Tenant,
		Decode: adoptedDecodeToWire(rec.Decode),
	}
}

func recordFromWire(class string, in *wire.AdoptedBooking) scheduler.BookingRecord {
	return scheduler.BookingRecord{
		RequestID: in.RequestID, Class: class, Worker: in.Worker, BlockHashes: in.BlockHashes,
		PromptTokens: in.PromptTokens, CachedTokens: in.CachedTokens, TierCreditTokens: in.TierCredit,
		ExpectedOutputTokens: in.ExpectedOutput, Sequences: in.Sequences, FirstTokenSeen: in.FirstTokenSeen, Tenant: in.Tenant,
		Decode: adoptedDecodeFromWire(in.Decode),
	}
}
