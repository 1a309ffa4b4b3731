// Command cdi-check reads a CDI spec directory with the container runtimes' own CDI library
// (tags.cncf.io/container-device-interface, as containerd and CRI-O use it) and resolves
// device names the way a runtime does before it starts a container.
//
//	cdi-check <spec-dir> <vendor/class=name>...
//
// It prints one JSON object: "errors" (every spec file the library refused, with why),
// "devices" (for each name: found or not, and the edits a runtime would apply, the spec's
// own edits merged with the device's, validated). It exits 0 whenever it could run; the
// caller (tests/node/test_cdi_runtime.py) asserts on the JSON.
//
// Device nodes are not injected into an OCI spec: that stats the host's /dev entries, which a
// machine without a GPU does not have. Everything else the runtime checks is checked.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

type device struct {
	Found       bool     `json:"found"`
	Error       string   `json:"error,omitempty"`
	Env         []string `json:"env,omitempty"`
	DeviceNodes []string `json:"deviceNodes,omitempty"`
	Mounts      []string `json:"mounts,omitempty"`
}

type report struct {
	Errors  map[string][]string `json:"errors"`
	Devices map[string]device   `json:"devices"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-check <spec-dir> <vendor/class=name>...")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(os.Args[1]), cdi.WithAutoRefresh(false))
	out := report{Errors: map[string][]string{}, Devices: map[string]device{}}
	if err != nil {
		out.Errors[os.Args[1]] = append(out.Errors[os.Args[1]], err.Error())
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			out.Errors[path] = append(out.Errors[path], e.Error())
		}
	}
	for _, name := range os.Args[2:] {
		out.Devices[name] = resolve(cache, name)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func resolve(cache *cdi.Cache, name string) device {
	if _, _, _, err := parser.ParseQualifiedName(name); err != nil {
		return device{Error: err.Error()}
	}
	dev := cache.GetDevice(name)
	if dev == nil {
		return device{}
	}
	raw := dev.GetSpec()
	merged := &specs.ContainerEdits{}
	for _, e := range []specs.ContainerEdits{raw.ContainerEdits, dev.ContainerEdits} {
		merged.Env = append(merged.Env, e.Env...)
		merged.DeviceNodes = append(merged.DeviceNodes, e.DeviceNodes...)
		merged.Mounts = append(merged.Mounts, e.Mounts...)
		merged.Hooks = append(merged.Hooks, e.Hooks...)
	}
	edits := &cdi.ContainerEdits{ContainerEdits: merged}
	got := device{Found: true}
	if err := edits.Validate(); err != nil {
		got.Error = err.Error()
	}
	got.Env = append(got.Env, merged.Env...)
	for _, d := range merged.DeviceNodes {
		got.DeviceNodes = append(got.DeviceNodes, d.Path)
	}
	for _, m := range merged.Mounts {
		got.Mounts = append(got.Mounts, m.HostPath+":"+m.ContainerPath)
	}
	sort.Strings(got.Env)
	return got
}
