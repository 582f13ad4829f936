package admission

import (
	"time"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// A disaggregated grant crosses NATS as one reply: the prefill worker in
// the reply's own fields, the decode worker in AdmitReply.Decode, their
// bookings linked at the owner (scheduler/disagg.go), so every lifecycle
// mark, renewal, cancel and adoption names the prefill booking alone and
// moves both.

// decodeToWire is the reply's decode half and decision label.
func decodeToWire(g scheduler.Grant) (*wire.AdmitDecode, string) {
	label := ""
	if g.Decision != scheduler.DecisionNone {
		label = g.Decision.String()
	}
	if !g.Disaggregated() {
		return nil, label
	}
	d := &g.Decode
	return &wire.AdmitDecode{Worker: d.Worker, URL: d.URL, BlockSize: d.BlockSize, Booking: uint64(d.Booking),
		TransferNano: int64(d.Transfer)}, label
}

// decodeFromWire fills g's decode half from a reply. An unknown decision
// label (a newer owner) reads as none: it is a diagnostic.
func decodeFromWire(in *wire.AdmitReply, g *scheduler.Grant) {
	g.Decision, _ = scheduler.ParseDecision(in.Decision)
	if d := in.Decode; d != nil {
		g.Decode = scheduler.GrantDecode{Worker: d.Worker, URL: d.URL, BlockSize: d.BlockSize,
			Booking: scheduler.BookingID(d.Booking), Transfer: time.Duration(max(d.TransferNano, 0))}
	}
}

// decodeRecord is the decode side of the record an entry keeps to re-home
// a pair after an ownership move.
func decodeRecord(r *scheduler.Request, g scheduler.Grant) scheduler.DecodeRecord {
	if !g.Disaggregated() {
		return scheduler.DecodeRecord{}
	}
	return scheduler.DecodeRecord{Worker: g.Decode.Worker, BlockHashes: r.HashesFor(g.Decode.BlockSize)}
}

func adoptedDecodeToWire(d scheduler.DecodeRecord) *wire.AdoptedDecode {
	if d.Worker == "" {
		return nil
	}
	return &wire.AdoptedDecode{Worker: d.Worker, BlockHashes: d.BlockHashes}
}

func adoptedDecodeFromWire(d *wire.AdoptedDecode) scheduler.DecodeRecord {
	if d == nil {
		return scheduler.DecodeRecord{}
	}
	return scheduler.DecodeRecord{Worker: d.Worker, BlockHashes: d.BlockHashes}
}
