package bench

import "time"

// SpreadArrivals spreads requests that share one arrival time evenly over
// Window: the j-th of k requests stamped t arrives at t + j·Window/k. Public
// traces quantise arrivals (Mooncake's come in about 3 s steps, about ten
// requests a step); replayed as-is, every request of a step reaches the
// routers at the same instant, a burst no real client population produces.
// Window 0 leaves arrivals untouched. Order is kept: the spread never moves
// a request past the next step when Window is at most the step.
type SpreadArrivals struct {
	Src    Source
	Window time.Duration

	group []TraceRequest // the current step, already spread
	pos   int
	next  *TraceRequest // first request of the following step
	err   error         // the source's error after the buffered requests
}

// Next implements Source.
func (s *SpreadArrivals) Next() (TraceRequest, error) {
	if s.Window <= 0 {
		return s.Src.Next()
	}
	if s.pos < len(s.group) {
		s.pos++
		return s.group[s.pos-1], nil
	}
	if s.err != nil {
		return TraceRequest{}, s.err
	}
	s.group, s.pos = s.group[:0], 0
	if s.next != nil {
		s.group = append(s.group, *s.next)
		s.next = nil
	} else {
		r, err := s.Src.Next()
		if err != nil {
			s.err = err
			return TraceRequest{}, err
		}
		s.group = append(s.group, r)
	}
	for {
		r, err := s.Src.Next()
		if err != nil {
			s.err = err
			break
		}
		if r.Arrival != s.group[0].Arrival {
			s.next = &r
			break
		}
		s.group = append(s.group, r)
	}
	k := time.Duration(len(s.group))
	for j := range s.group {
		s.group[j].Arrival += time.Duration(j) * s.Window / k
	}
	s.pos = 1
	return s.group[0], nil
}
