// Test infrastructure only: CoreDNS with just the plugins the node's
// Corefile names (scripts/node.sh: bind, errors, kubernetes, cache).
// CoreDNS's own main compiles in every plugin it ships, the cloud
// providers' SDKs among them, which tripled the build for nothing the
// node uses; this main is CoreDNS's documented way to choose plugins at
// compile time (its coremain and dnsserver packages, plugins imported for
// their registration), and nothing of CoreDNS's source is copied.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

// The plugins compiled in, kept in CoreDNS's own order (its plugin.cfg),
// which decides the order a query passes through them.
var compiledIn = map[string]bool{"bind": true, "errors": true, "cache": true, "kubernetes": true}

func init() {
	directives := dnsserver.Directives[:0:0]
	for _, name := range dnsserver.Directives {
		if compiledIn[name] {
			directives = append(directives, name)
		}
	}
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
