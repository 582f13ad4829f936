package wire

import (
	"encoding/json"
	"fmt"
)

// Status probes (design §4, docs/architecture.md "The status probe"): an
// entry whose admit request has had no answer for a while asks the replica
// it sent the attempt to what became of it, with a StatusRequest on
// Status(<owner replica>), and gets a StatusReply: the attempt is queued
// (keep waiting), granted (the grant, again, for the entry to use in place
// of the lost reply), or unknown (never seen, or finished: cancel it and
// resubmit).
//
//	E → O  status.<owner>  StatusRequest  (request-reply; the reply is StatusReply)

// Status is the request-reply subject on which replica answers entries'
// status probes about the attempts they sent it.
func (s Subjects) Status(replica string) string { return s.prefix + "status." + replica }

// AttemptStatus is an owner's answer about one attempt.
type AttemptStatus string

// The answers of a status probe.
const (
	StatusQueued  AttemptStatus = "queued"
	StatusGranted AttemptStatus = "granted"
	StatusUnknown AttemptStatus = "unknown"
)

// StatusRequest asks Owner about attempt Attempt of request ID of Class,
// sent by Entry.
type StatusRequest struct {
	Version int    `json:"v"`
	Class   string `json:"class"`
	ID      string `json:"id"`
	Attempt int    `json:"attempt,omitempty"`
	Entry   string `json:"entry"`
	Owner   string `json:"owner"`
}

// StatusReply answers a StatusRequest. Grant, with StatusGranted only, is
// the admit reply of the attempt's grant as the owner sent it (OK, with its
// booking, epoch and instance): the entry uses it exactly as it would have
// used that reply.
type StatusReply struct {
	Version  int           `json:"v"`
	Owner    string        `json:"owner"`
	Instance uint64        `json:"instance,omitempty"`
	Status   AttemptStatus `json:"status"`
	Grant    *AdmitReply   `json:"grant,omitempty"`
}

// EncodeStatus marshals a status message, stamping its version (and its
// grant's).
func EncodeStatus(m any) ([]byte, error) {
	switch v := m.(type) {
	case *StatusRequest:
		v.Version = admissionVersion
	case *StatusReply:
		v.Version = admissionVersion
		if v.Grant != nil {
			v.Grant.Version = admissionVersion
		}
	default:
		return nil, fmt.Errorf("wire: %T is not a status message", m)
	}
	return json.Marshal(m)
}

// DecodeStatusRequest parses and validates a StatusRequest.
func DecodeStatusRequest(p []byte) (*StatusRequest, error) {
	var m StatusRequest
	if err := decodeVersioned(p, &m, &m.Version, "status request"); err != nil {
		return nil, err
	}
	switch {
	case m.ID == "" || len(m.ID) > 256:
		return nil, fmt.Errorf("%w: status request id %q", ErrMalformed, m.ID)
	case !ValidName(m.Class):
		return nil, fmt.Errorf("%w: status request class %q", ErrMalformed, m.Class)
	case !ValidName(m.Entry):
		return nil, fmt.Errorf("%w: status request entry %q", ErrMalformed, m.Entry)
	case !ValidName(m.Owner):
		return nil, fmt.Errorf("%w: status request owner %q", ErrMalformed, m.Owner)
	case m.Attempt < 0:
		return nil, fmt.Errorf("%w: status request of %s has attempt %d", ErrMalformed, m.ID, m.Attempt)
	}
	return &m, nil
}

// DecodeStatusReply parses and validates a StatusReply: a granted answer
// carries a valid grant (DecodeAdmitReply's checks), the others none.
func DecodeStatusReply(p []byte) (*StatusReply, error) {
	var m StatusReply
	if err := decodeVersioned(p, &m, &m.Version, "status reply"); err != nil {
		return nil, err
	}
	if !ValidName(m.Owner) {
		return nil, fmt.Errorf("%w: status reply owner %q", ErrMalformed, m.Owner)
	}
	switch m.Status {
	case StatusQueued, StatusUnknown:
		if m.Grant != nil {
			return nil, fmt.Errorf("%w: a %s status reply carries a grant", ErrMalformed, m.Status)
		}
	case StatusGranted:
		if m.Grant == nil || !m.Grant.OK {
			return nil, fmt.Errorf("%w: a granted status reply without its grant", ErrMalformed)
		}
		// The grant is checked as the admit reply it repeats.
		raw, err := json.Marshal(m.Grant)
		if err != nil {
			return nil, fmt.Errorf("%w: status reply grant: %v", ErrMalformed, err)
		}
		g, err := DecodeAdmitReply(raw)
		if err != nil {
			return nil, fmt.Errorf("status reply grant: %w", err)
		}
		if g.Owner != m.Owner || g.Instance != m.Instance {
			return nil, fmt.Errorf("%w: status reply of %s carries a grant of %s", ErrMalformed, m.Owner, g.Owner)
		}
		m.Grant = g
	default:
		return nil, fmt.Errorf("%w: status reply status %q", ErrMalformed, m.Status)
	}
	return &m, nil
}
