// Command etcd is the etcd server for Switchyard's container images. It is
// upstream etcd (go.etcd.io/etcd/server/v3/etcdmain, the version pinned in
// go.mod, so the containers run the same etcd the in-process tests embed)
// plus one extra subcommand, `etcd healthcheck [-url URL]`, because an image
// built FROM scratch has no curl for its HEALTHCHECK.
//
// `go install go.etcd.io/etcd/server/v3@version` is refused (its go.mod has
// replace directives), hence this wrapper. Every other argument list goes to
// etcd unchanged, so all of etcd's flags and ETCD_* environment variables work.
//
// Concurrency: the server owns its goroutines; healthcheck is one blocking
// HTTP request bounded by -timeout.
package main
