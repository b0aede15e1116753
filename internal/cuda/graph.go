package cuda

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// CUDA graphs: capture the work queued on a stream once, replay it with one
// launch. The entry points are resolved on first use rather than at Open, so
// a driver without them still runs everything else; GraphsAvailable says
// whether they are there.

// Graph is a captured CUgraph; GraphExec its instantiated, launchable form.
type (
	Graph     uintptr
	GraphExec uintptr
)

// graphSymbols are the driver entry points of this file.
var graphSymbols = []string{
	"cuStreamBeginCapture_v2",
	"cuStreamEndCapture",
	"cuGraphInstantiateWithFlags",
	"cuGraphLaunch",
	"cuGraphExecDestroy",
	"cuGraphDestroy",
}

var (
	graphOnce sync.Once
	graphFns  map[string]uintptr
	graphErr  error
)

// resolveGraph looks the graph entry points up once per process.
func (d *driver) resolveGraph() error {
	graphOnce.Do(func() {
		fns := make(map[string]uintptr, len(graphSymbols))
		for _, name := range graphSymbols {
			addr, err := lookup(d.handle, name, nil)
			if err != nil {
				graphErr = fmt.Errorf("cuda: %s: %w (driver too old for CUDA graphs?)", name, err)
				return
			}
			fns[name] = addr
		}
		graphFns = fns
	})
	return graphErr
}

// graphCall is Ctx.call for the lazily resolved graph entry points.
// uintptrescapes: see Ctx.call.
//
//go:uintptrescapes
func (c *Ctx) graphCall(name string, args ...uintptr) error {
	if c == nil || !c.valid {
		return fmt.Errorf("cuda: %s called with a Ctx outside its Device.Do", name)
	}
	if err := c.d.drv.resolveGraph(); err != nil {
		return err
	}
	r, _, _ := purego.SyscallN(graphFns[name], args...)
	if code := int(int32(r)); code != 0 {
		return c.d.drv.errorFor(name, code)
	}
	return nil
}

// GraphsAvailable reports whether the driver has the graph entry points
// (nil) or why not.
func (c *Ctx) GraphsAvailable() error {
	if c == nil || !c.valid {
		return fmt.Errorf("cuda: GraphsAvailable called with a Ctx outside its Device.Do")
	}
	return c.d.drv.resolveGraph()
}

// captureModeRelaxed is CU_STREAM_CAPTURE_MODE_RELAXED: other threads'
// unsafe calls (allocations, synchronous copies) stay legal during capture.
const captureModeRelaxed = 2

// BeginCapture starts capturing the work queued on s (not the legacy
// default stream) into a graph. Every BeginCapture needs an EndCapture, also
// on error, or the stream stays in capture mode.
func (c *Ctx) BeginCapture(s Stream) error {
	if s == 0 {
		return fmt.Errorf("cuda: cannot capture the legacy default stream")
	}
	return c.graphCall("cuStreamBeginCapture_v2", uintptr(s), captureModeRelaxed)
}

// EndCapture ends the capture on s and returns the graph.
func (c *Ctx) EndCapture(s Stream) (Graph, error) {
	g := new(uintptr)
	if err := c.graphCall("cuStreamEndCapture", uintptr(s), uintptr(unsafe.Pointer(g))); err != nil {
		return 0, err
	}
	return Graph(*g), nil
}

// Instantiate makes a launchable graph (cuGraphInstantiateWithFlags, no flags).
func (c *Ctx) Instantiate(g Graph) (GraphExec, error) {
	e := new(uintptr)
	if err := c.graphCall("cuGraphInstantiateWithFlags", uintptr(unsafe.Pointer(e)), uintptr(g), 0); err != nil {
		return 0, err
	}
	return GraphExec(*e), nil
}

// LaunchGraph queues one replay of e on stream s.
func (c *Ctx) LaunchGraph(e GraphExec, s Stream) error {
	return c.graphCall("cuGraphLaunch", uintptr(e), uintptr(s))
}

// DestroyGraph releases a captured graph (its instantiations stay valid).
func (c *Ctx) DestroyGraph(g Graph) error {
	if g == 0 {
		return nil
	}
	return c.graphCall("cuGraphDestroy", uintptr(g))
}

// DestroyGraphExec releases an instantiated graph.
func (c *Ctx) DestroyGraphExec(e GraphExec) error {
	if e == 0 {
		return nil
	}
	return c.graphCall("cuGraphExecDestroy", uintptr(e))
}
