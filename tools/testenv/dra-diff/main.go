// dra-diff answers DRA allocation and CEL cases with the upstream code kube-scheduler runs:
// k8s.io/dynamic-resource-allocation/structured (the allocator) and .../cel (the selector
// environment), at the control plane's version. kallot's differential test
// (tests/dra/test_dra_differential.py, kallot.testing.dra_diff) writes one JSON case per line
// on stdin and reads one JSON answer per line on stdout.
//
// An allocation case:
//
//	{"id": "c1", "listTypes": false, "node": {"name": "n1", "labels": {}},
//	 "slices": [ResourceSlice], "classes": [DeviceClass], "claims": [ResourceClaim],
//	 "allocated": [ResourceClaim with status.allocation], "repeat": 1}
//
// answers {"id": "c1", "status": "ok"|"unschedulable"|"error", "error": "...",
// "allocations": [AllocationResult per claim], "nanos": median time of NewAllocator+Allocate}.
// The allocated state is built as kube-scheduler's DynamicResources plugin builds it
// (admin-access results occupy nothing; results with a shareID are shares with consumed
// capacity); features are kube-scheduler 1.36's with every DRA gate kallot implements on,
// plus DRAListTypeAttributes when listTypes is set. The filter budget is 10 s, as
// kube-scheduler's default FilterTimeout.
//
// A CEL case: {"id": "e1", "cel": "expr", "listTypes": false, "device": {"driver": ...,
// "allowMultipleAllocations": true, "attributes": {...}, "capacity": {...}}} answers
// {"id": "e1", "status": "ok"|"compile_error"|"runtime_error", "value": bool, "error": "...",
// "cost": estimated max cost}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

type nodeIn struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type deviceIn struct {
	Driver                   string                                                    `json:"driver"`
	AllowMultipleAllocations *bool                                                     `json:"allowMultipleAllocations"`
	Attributes               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Capacity                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity  `json:"capacity"`
}

type caseIn struct {
	ID        string                       `json:"id"`
	ListTypes bool                         `json:"listTypes"`
	Node      nodeIn                       `json:"node"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Classes   []*resourceapi.DeviceClass   `json:"classes"`
	Claims    []*resourceapi.ResourceClaim `json:"claims"`
	Allocated []*resourceapi.ResourceClaim `json:"allocated"`
	Repeat    int                          `json:"repeat"`
	CEL       *string                      `json:"cel"`
	Device    *deviceIn                    `json:"device"`
}

type answer struct {
	ID          string                         `json:"id"`
	Status      string                         `json:"status"`
	Error       string                         `json:"error,omitempty"`
	Allocations []resourceapi.AllocationResult `json:"allocations,omitempty"`
	Nanos       int64                          `json:"nanos,omitempty"`
	Value       *bool                          `json:"value,omitempty"`
	Cost        *uint64                        `json:"cost,omitempty"`
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, v := range c {
		out = append(out, v)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if v, ok := c[name]; ok {
		return v, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, name)
}

func features(listTypes bool) structured.Features {
	return structured.Features{
		AdminAccess:            true,
		PrioritizedList:        true,
		PartitionableDevices:   true,
		DeviceTaints:           true,
		DeviceBindingAndStatus: true,
		ConsumableCapacity:     true,
		ListTypeAttributes:     listTypes,
	}
}

// allocatedState mirrors kube-scheduler's foreachAllocatedDevice (allocateddevices.go).
func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	s := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if ptr.Deref(r.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				s.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					s.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			s.AllocatedDevices.Insert(id)
		}
	}
	return s
}

func allocate(c *caseIn, cache *cel.Cache) answer {
	out := answer{ID: c.ID}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.Node.Name, Labels: c.Node.Labels}}
	lister := classes{}
	for _, cl := range c.Classes {
		lister[cl.Name] = cl
	}
	repeat := max(c.Repeat, 1)
	times := make([]int64, 0, repeat)
	var results []resourceapi.AllocationResult
	var err error
	for i := 0; i < repeat; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		var alloc structured.Allocator
		alloc, err = structured.NewAllocator(ctx, features(c.ListTypes), allocatedState(c.Allocated), lister, c.Slices, cache)
		if err == nil {
			results, err = alloc.Allocate(ctx, node, c.Claims)
		}
		times = append(times, time.Since(start).Nanoseconds())
		cancel()
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	out.Nanos = times[len(times)/2]
	switch {
	case err != nil && errors.Is(err, structured.ErrFailedAllocationOnNode):
		out.Status, out.Error = "unschedulable", err.Error()
	case err != nil:
		out.Status, out.Error = "error", err.Error()
	case results == nil:
		out.Status = "unschedulable"
	default:
		out.Status, out.Allocations = "ok", results
	}
	return out
}

func evaluate(c *caseIn, caches map[bool]*cel.Cache) answer {
	out := answer{ID: c.ID}
	expr := caches[c.ListTypes].GetOrCompile(*c.CEL)
	if expr.Error != nil {
		out.Status, out.Error = "compile_error", expr.Error.Error()
		return out
	}
	out.Cost = ptr.To(expr.MaxCost)
	d := c.Device
	if d == nil {
		d = &deviceIn{}
	}
	ok, _, err := expr.DeviceMatches(context.Background(), cel.Device{
		Driver: d.Driver, AllowMultipleAllocations: d.AllowMultipleAllocations,
		Attributes: d.Attributes, Capacity: d.Capacity,
	})
	if err != nil {
		out.Status, out.Error = "runtime_error", err.Error()
		return out
	}
	out.Status, out.Value = "ok", ptr.To(ok)
	return out
}

func main() {
	caches := map[bool]*cel.Cache{
		false: cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true}),
		true:  cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true, EnableListTypeAttributes: true}),
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	w := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(w)
	for in.Scan() {
		var c caseIn
		var a answer
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			a = answer{ID: c.ID, Status: "bad_input", Error: err.Error()}
		} else if c.CEL != nil {
			a = evaluate(&c, caches)
		} else {
			a = allocate(&c, caches[c.ListTypes])
		}
		if err := enc.Encode(a); err != nil {
			fmt.Fprintln(os.Stderr, "dra-diff:", err)
			os.Exit(1)
		}
		w.Flush()
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "dra-diff:", err)
		os.Exit(1)
	}
}
