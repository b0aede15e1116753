package main

import (
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"time"
)

// startProfiles is a developer's aid, not a flag: MOEPREP_CPUPROFILE=FILE
// writes a CPU profile of the whole command, and MOEPREP_HEAPPROFILE=FILE a
// heap profile taken when the live heap was at its largest (sampled every
// 50 ms), which is what peak RSS is made of; a profile at exit would show
// what was already freed; MOEPREP_TRACE=FILE an execution trace (`go tool
// trace`), which shows what a run's goroutines wait on and when the cores
// sit idle. The returned function stops them. Per-tensor
// costs (issue 45) are found this way on a checkpoint of many tensors.
func startProfiles() (stop func()) {
	var stops []func()
	if path := os.Getenv("MOEPREP_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
		}
	}
	if path := os.Getenv("MOEPREP_TRACE"); path != "" {
		if f, err := os.Create(path); err == nil && trace.Start(f) == nil {
			stops = append(stops, func() { trace.Stop(); f.Close() })
		}
	}
	if path := os.Getenv("MOEPREP_HEAPPROFILE"); path != "" {
		done, finished := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(finished)
			sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			var peak uint64
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			// A command shorter than a tick still gets the one taken as it
			// ends.
			for stop := false; !stop; {
				select {
				case <-done:
					stop = true
				case <-tick.C:
				}
				metrics.Read(sample)
				if live := sample[0].Value.Uint64(); live > peak+peak/20 {
					peak = live
					if f, err := os.Create(path); err == nil {
						pprof.Lookup("heap").WriteTo(f, 0)
						f.Close()
					}
				}
			}
		}()
		stops = append(stops, func() { close(done); <-finished })
	}
	if len(stops) > 0 {
		// Sample every allocation's site more densely than the default
		// 512 kB so small per-tensor structs show up.
		runtime.MemProfileRate = 64 << 10
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}
