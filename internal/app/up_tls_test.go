package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/links"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

func TestUpWithTLSServesOverHTTPSAndRefusesClientsWithoutCredentials(t *testing.T) {
	cfg := upTestConfig(t, 2, 2)
	cfg.TLS = true
	up := startUpRun(t, cfg)
	defer up.stop(t)

	endpoint := regexp.MustCompile(`OpenAI API  https://(\S+)/v1`)
	caLine := regexp.MustCompile(`CA (\S+) \(made for this run\)`)
	upLine := regexp.MustCompile(`embedded etcd (\S+), NATS (\S+)\)`)
	lines := up.lines
	var addrs []string
	var caFile, etcdURL, natsURL string
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "Try:") {
		if m := endpoint.FindStringSubmatch(lines.Text()); m != nil {
			addrs = append(addrs, m[1])
		}
		if m := caLine.FindStringSubmatch(lines.Text()); m != nil {
			caFile = m[1]
		}
		if m := upLine.FindStringSubmatch(lines.Text()); m != nil {
			etcdURL, natsURL = m[1], m[2]
		}
	}
	up.drain()
	require.Len(t, addrs, 2, "up prints one https endpoint per replica")
	require.NotEmpty(t, caFile)
	require.True(t, strings.HasPrefix(etcdURL, "https://"), etcdURL)
	require.True(t, strings.HasPrefix(natsURL, "tls://"), natsURL)

	tc, err := tlsconf.ClientConfig{CAFile: caFile}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, a := range addrs {
		resp, err := client.Post("https://"+a+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"switchyard-sim","prompt":"hello over TLS","max_tokens":4}`))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "completion via %s: %s", a, body)
		require.Contains(t, string(body), `"completion_tokens":4`)
		require.Contains(t, resp.Header.Get("X-Switchyard-Routed-Worker"), "worker-", "routed to a worker over HTTPS")
		// Plain HTTP on the API port gets nowhere.
		resp, err = http.Get("http://" + a + "/readyz")
		if err == nil {
			resp.Body.Close()
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "net/http answers plaintext on a TLS port with 400")
		}
	}

	// The workers registered https:// URLs: the router reached them over TLS.
	resp, err := client.Get("https://" + addrs[0] + "/debug/cluster")
	require.NoError(t, err)
	doc, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 2, strings.Count(string(doc), `"URL":"https://`), "%s", doc)
	require.NotContains(t, string(doc), `"URL":"http://`)

	// etcd: the CA alone (no client certificate) is refused.
	ecfg, err := links.Etcd{TLS: tlsconf.ClientConfig{CAFile: caFile}}.ClientConfig([]string{etcdURL}, zap.NewNop(), tlsconf.Deps{})
	require.NoError(t, err)
	ecfg.DialTimeout = 2 * time.Second
	if ec, err := clientv3.New(ecfg); err == nil {
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = ec.Put(pctx, "/switchyard/default/intruder", "x")
		pcancel()
		_ = ec.Close()
		require.Error(t, err, "etcd accepted a client without a certificate")
	}
	// NATS: TLS verified by the CA but no client certificate: refused.
	opts, err := links.NATS{TLS: tlsconf.ClientConfig{CAFile: caFile}, User: "router", Password: "guess"}.Options(natsURL, tlsconf.Deps{})
	require.NoError(t, err)
	_, err = nats.Connect(natsURL, opts...)
	require.Error(t, err)
}

func TestUpsNATSPermissionsAreTheShippedOnes(t *testing.T) {
	t.Setenv("SWITCHYARD_NATS_ROUTER_PASSWORD", "r")
	for i := 1; i <= 8; i++ {
		t.Setenv(fmt.Sprintf("SWITCHYARD_NATS_WORKER_%d_PASSWORD", i), "w")
	}
	shipped, err := natsserver.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats", "auth.conf"))
	require.NoError(t, err)
	byName := map[string]*natsserver.Permissions{}
	for _, u := range shipped.Users {
		byName[u.Username] = u.Permissions
	}
	ours := map[string]*natsserver.Permissions{}
	for _, u := range natsUsers("r", map[string]string{"worker-1": "w", "worker-7": "w"}) {
		ours[u.Username] = u.Permissions
	}
	for _, name := range []string{"router", "worker-1", "worker-7"} {
		require.Equal(t, byName[name], ours[name], "user %s", name)
	}
}
