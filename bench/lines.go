package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxLineBytes bounds one trace line. Mooncake lines hold one id per 512
// prompt tokens (a few KB at most); 16 MiB leaves room for far longer traces
// while keeping a corrupt file from exhausting memory.
const maxLineBytes = 16 << 20

// lineReader yields non-blank lines with their 1-based numbers.
type lineReader struct {
	sc   *bufio.Scanner
	name string
	line int
}

func newLineReader(r io.Reader, name string) *lineReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	return &lineReader{sc: sc, name: name}
}

// next returns the next non-blank line (without its newline or trailing CR),
// valid until the following call, or io.EOF.
func (l *lineReader) next() ([]byte, error) {
	for l.sc.Scan() {
		l.line++
		b := bytes.TrimRight(l.sc.Bytes(), "\r")
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		return b, nil
	}
	if err := l.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &LineError{File: l.name, Line: l.line + 1, Err: badRecord("line longer than %d bytes", maxLineBytes)}
		}
		return nil, fmt.Errorf("read %s after line %d: %w", l.nameOr(), l.line, err)
	}
	return nil, io.EOF
}

func (l *lineReader) nameOr() string {
	if l.name == "" {
		return "trace"
	}
	return l.name
}
