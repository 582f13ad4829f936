package healthcheck

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMainExitsZeroOnlyWhenTheURLAnswers200(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "starting", http.StatusServiceUnavailable)
	}))
	defer sick.Close()
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"--url", ok.URL}, "", &out, &errOut); code != 0 {
		t.Fatalf("healthy URL: exit %d (%s)", code, errOut.String())
	}
	if code := Main(context.Background(), []string{"--url", sick.URL}, "", &out, &errOut); code != 1 {
		t.Fatalf("503 URL: exit %d; want 1", code)
	}
	if !bytes.Contains(errOut.Bytes(), []byte("status 503: starting")) {
		t.Fatalf("the failure says why: %q", errOut.String())
	}
	if code := Main(context.Background(), []string{"--bogus"}, "", &out, &errOut); code != 2 {
		t.Fatalf("bad flag: exit %d; want 2", code)
	}
	ok.CloseClientConnections()
	ok.Client().CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
}
