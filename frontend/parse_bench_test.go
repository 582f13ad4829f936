package frontend

import (
	"bytes"
	"net/http"
	"testing"
)

// BenchmarkParseRequestLines is BenchmarkParseRequest on the chat with its
// sentences on lines of their own (BenchmarkReplicaThroughputLines' body):
// every message holds escaped newlines, as real ones do.
func BenchmarkParseRequestLines(b *testing.B) {
	body := bytes.ReplaceAll([]byte(chatBody(b, 4096)), []byte(") "), []byte(`)\n`))
	buf := make([]byte, 0, len(body)+1+streamUsageRoom)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	c0 := cpuTime()
	for b.Loop() {
		buf = append(buf[:0], body...)
		if _, e := parseRequest(endpointChat, buf, http.Header{}); e != nil {
			b.Fatal(e)
		}
	}
	reportCPU(b, c0)
}
