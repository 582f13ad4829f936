package frontend

import (
	"encoding/json"
	"strconv"

	"github.com/switchyard/switchyard/prompt"
)

// enginePriority is the body an engine that schedules by priority gets:
// body with vLLM's "priority" member (an integer, lower is served earlier,
// 0 by default) set from the request's strict priority (higher is served
// first), so the engine orders its own queue as the router does. A body
// that names a priority itself keeps it, as does a priority of 0 (the
// engine's default). Found on vLLM's OpenAI protocol (ChatCompletionRequest
// and CompletionRequest, priority: int, default 0; other values are refused
// unless the engine runs --scheduling-policy priority).
func enginePriority(body []byte, priority int32) []byte {
	if priority == 0 {
		return body
	}
	members, ok := prompt.ScanObject(body, nil)
	if !ok {
		return body
	}
	for _, m := range members {
		key := string(m.Key)
		if m.Escaped && json.Unmarshal(append(append([]byte{'"'}, m.Key...), '"'), &key) != nil {
			continue
		}
		if key == "priority" {
			return body
		}
	}
	open := 0
	for open < len(body) && body[open] != '{' {
		open++
	}
	out := make([]byte, 0, len(body)+24)
	out = append(out, body[:open+1]...)
	out = append(out, `"priority":`...)
	out = strconv.AppendInt(out, -int64(priority), 10)
	if len(members) > 0 {
		out = append(out, ',')
	}
	return append(out, body[open+1:]...)
}

// prioritySchedules reports whether worker's engine takes a priority.
func (s *Server) prioritySchedules(worker string) bool {
	for _, w := range s.deps.Workers.Workers() {
		if w.ID == worker {
			return w.PrioritySchedules
		}
	}
	return false
}
