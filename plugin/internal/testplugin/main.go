package main

// main is required for package main but is never run by a Proxy-Wasm host: in
// Go's wasip1 c-shared (reactor) mode _initialize runs the package init
// functions only. Registration happens in init (see plugin.go).
func main() {}
