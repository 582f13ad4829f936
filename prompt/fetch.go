package prompt

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/switchyard/switchyard/wire"
)

// Digest is the SHA-256 of tokenizer files as wire.TokenizerSource defines
// it (wire.TokenizerDigest: over the files in order, each as its name, a
// NUL byte, its length as 8 little-endian bytes, then its bytes;
// hex-encoded). names and files are parallel.
func Digest(names []string, files [][]byte) string {
	nf := make([]wire.NamedFile, len(names))
	for i, name := range names {
		nf[i] = wire.NamedFile{Name: name, Data: files[i]}
	}
	return wire.TokenizerDigest(nf)
}

// validFileName accepts the plain file names a source may advertise: no
// directories, nothing that escapes the URL's base.
func validFileName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\?#%") && path.Base(name) == name
}

// fetchFiles downloads src's files (URL + "/" + name), bounded by limit
// bytes in all, and checks them against src.SHA256 before returning them.
// A mismatch is ErrDigest: the files are refused whatever they hold.
func (r *Registry) fetchFiles(ctx context.Context, src wire.TokenizerSource, limit int64) (map[string][]byte, error) {
	base, err := url.Parse(src.URL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") {
		return nil, fmt.Errorf("%w: url %q is not http(s)", ErrFetch, src.URL)
	}
	if len(src.Files) == 0 || len(src.SHA256) != 64 {
		return nil, fmt.Errorf("%w: source %s advertises no files or no sha256", ErrFetch, src.URL)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	files := make([][]byte, len(src.Files))
	var total int64
	for i, name := range src.Files {
		if !validFileName(name) {
			return nil, fmt.Errorf("%w: file name %q", ErrFetch, name)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(src.URL, "/")+"/"+name, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFetch, err)
		}
		resp, err := r.client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrFetch, name, err)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, limit-total+1))
		_ = resp.Body.Close()
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: %s: %v", ErrFetch, name, err)
		case resp.StatusCode != http.StatusOK:
			return nil, fmt.Errorf("%w: %s: %s", ErrFetch, name, resp.Status)
		case total+int64(len(b)) > limit:
			return nil, fmt.Errorf("%w: the files are larger than %d bytes (-tokenizer.fetch-max-bytes)", ErrFetch, limit)
		}
		total += int64(len(b))
		files[i] = b
	}
	if got := Digest(src.Files, files); !strings.EqualFold(got, src.SHA256) {
		return nil, fmt.Errorf("%w: %s advertises %s, the files hash to %s", ErrDigest, src.URL, src.SHA256, got)
	}
	out := make(map[string][]byte, len(files))
	for i, name := range src.Files {
		out[name] = files[i]
	}
	return out, nil
}
