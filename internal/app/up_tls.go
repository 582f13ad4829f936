package app

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard/switchyard/internal/links"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

// upPKI is the throwaway security of `switchyard up --tls`: one CA made for
// the run, a certificate per role, a NATS password per user. Everything
// lives in dir, which the run removes on exit unless -data-dir keeps it.
type upPKI struct {
	dir             string
	etcd, nats      tlsconf.Files // servers (and etcd's peer link)
	router, worker  tlsconf.Files // HTTP servers: the API, the engines
	adapter         tlsconf.Files // HTTP server of the adapters (-protocol vllm)
	routerClient    tlsconf.Files // routers' client certificate (etcd, NATS, engines, adapters)
	workerClient    tlsconf.Files // workers' and adapters' client certificate (etcd, NATS; adapters: their engine)
	routerPassword  string
	workerPasswords map[string]string
}

// upCertValidity outlives any demo session; the CA dies with the run.
const upCertValidity = 7 * 24 * time.Hour

func newUpPKI(dir, host string, workers []string) (*upPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := tlsconf.NewCA("switchyard up", upCertValidity)
	if err != nil {
		return nil, err
	}
	hosts := []string{host, "localhost", "127.0.0.1", "::1"}
	p := &upPKI{dir: dir, workerPasswords: map[string]string{}}
	for _, c := range []struct {
		f     *tlsconf.Files
		name  string
		hosts []string
		u     tlsconf.Usage
	}{
		{&p.etcd, "etcd", hosts, tlsconf.Server},
		{&p.nats, "nats", hosts, tlsconf.Server},
		{&p.router, "router", hosts, tlsconf.Server},
		{&p.worker, "worker", hosts, tlsconf.Server},
		{&p.adapter, "adapter", hosts, tlsconf.Server},
		{&p.routerClient, "router-client", nil, tlsconf.Client},
		{&p.workerClient, "worker-client", nil, tlsconf.Client},
	} {
		if *c.f, err = ca.WriteFiles(dir, c.name, c.hosts, c.u, upCertValidity); err != nil {
			return nil, err
		}
	}
	if p.routerPassword, err = randomSecret(); err != nil {
		return nil, err
	}
	for _, w := range workers {
		if p.workerPasswords[w], err = randomSecret(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func randomSecret() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// routerLinks are a replica's etcd and NATS settings under --tls.
func (p *upPKI) routerLinks() Links {
	c := tlsconf.ClientConfig{CAFile: p.routerClient.CA, CertFile: p.routerClient.Cert, KeyFile: p.routerClient.Key}
	return Links{Etcd: links.Etcd{TLS: c}, NATS: links.NATS{TLS: c, User: natsRouterUser, Password: p.routerPassword}}
}

// workerLinks are worker id's etcd and NATS settings under --tls.
func (p *upPKI) workerLinks(id string) Links {
	c := tlsconf.ClientConfig{CAFile: p.workerClient.CA, CertFile: p.workerClient.Cert, KeyFile: p.workerClient.Key}
	return Links{Etcd: links.Etcd{TLS: c}, NATS: links.NATS{TLS: c, User: id, Password: p.workerPasswords[id]}}
}

// natsRouterUser is the routers' NATS user, as in deploy/nats/auth.conf.
const natsRouterUser = "router"

// natsUsers are the NATS users and subject permissions of
// deploy/nats/auth.conf, built for up's workers (a test checks the two
// agree): routers may use the admission subjects and read every worker's
// events; a worker publishes only its own events and load reports and
// answers only its own dump requests.
func natsUsers(routerPassword string, workerPasswords map[string]string) []*natsserver.User {
	router := &natsserver.Permissions{
		Publish: &natsserver.SubjectPermission{Allow: []string{"sy.*.admit.*", "sy.*.cancel.*", "sy.*.life.*", "sy.*.adopt.*", "sy.*.quota.*", "sy.*.quotarecall.*", "sy.*.status.*", "sy.*.kvdump.*", "_INBOX.>"}},
		Subscribe: &natsserver.SubjectPermission{Allow: []string{"sy.*.kv.*", "sy.*.load.*", "sy.*.admit.*", "sy.*.cancel.*",
			"sy.*.life.*", "sy.*.adopt.*", "sy.*.quota.*", "sy.*.quotarecall.*", "sy.*.status.*", "_INBOX.>"}},
	}
	users := []*natsserver.User{{Username: natsRouterUser, Password: routerPassword, Permissions: router}}
	for id, pw := range workerPasswords {
		users = append(users, &natsserver.User{Username: id, Password: pw, Permissions: workerPermissions(id)})
	}
	return users
}

func workerPermissions(id string) *natsserver.Permissions {
	return &natsserver.Permissions{
		Publish:   &natsserver.SubjectPermission{Allow: []string{"sy.*.kv." + id, "sy.*.load." + id}},
		Subscribe: &natsserver.SubjectPermission{Allow: []string{"sy.*.kvdump." + id}},
		// A dump is answered in chunks, all to the request's inbox.
		Response: &natsserver.ResponsePermission{MaxMsgs: -1, Expires: time.Minute},
	}
}

// natsTLSOptions turn on TLS with required client certificates.
func (p *upPKI) natsTLSOptions(o *natsserver.Options) error {
	tc, err := tlsconf.ServerConfig{CertFile: p.nats.Cert, KeyFile: p.nats.Key, ClientCAFile: p.nats.CA}.Build(tlsconf.Deps{Name: "nats_server"})
	if err != nil {
		return fmt.Errorf("embedded NATS TLS: %w", err)
	}
	o.TLSConfig, o.TLSVerify, o.TLSTimeout = tc, true, 2
	return nil
}

func (p *upPKI) caFile() string { return filepath.Join(p.dir, "ca.crt") }
