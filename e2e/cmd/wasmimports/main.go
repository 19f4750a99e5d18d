// Command wasmimports lists the imports of Proxy-Wasm modules and checks
// them against the set proxy-wasm-cpp-host offers (the list lives in
// e2e/envoyhost/imports.go, with its sources): a module importing anything
// else fails to load in Envoy. It exits 1 if any module would be refused.
//
//	wasmimports bin/wasm-epp.wasm
//	wasmimports -wasi-profile legacy -v bin/wasm-epp.wasm
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
)

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wasmimports", flag.ContinueOnError)
	fs.SetOutput(stderr)
	profile := fs.String("wasi-profile", "current", "cpp-host WASI set to check against: current or legacy")
	verbose := fs.Bool("v", false, "list every import, not only the problems")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: wasmimports [flags] module.wasm...\n\nChecks that every import is offered by proxy-wasm-cpp-host.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	p, err := envoyhost.ParseWASIProfile(*profile)
	if err != nil || fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	code := 0
	for _, path := range fs.Args() {
		bin, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", path, err)
			code = 1
			continue
		}
		info, err := envoyhost.CheckModule(bin, p)
		if info != nil && *verbose {
			allowed := envoyhost.AllowedImports(info.ABI, p)
			fmt.Fprintf(stdout, "%s: ABI %s, %d imports\n", path, info.ABI, len(info.Imports))
			for _, im := range info.Imports {
				status := "ok"
				if _, ok := allowed[im.QualifiedName()]; !ok {
					status = "NOT OFFERED"
				}
				fmt.Fprintf(stdout, "  %-50s %s\n", im.QualifiedName(), status)
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", path, err)
			code = 1
			continue
		}
		fmt.Fprintf(stdout, "%s: ok (ABI %s, %d imports, WASI profile %s)\n", path, info.ABI, len(info.Imports), p)
	}
	return code
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
