package cuda

import "unsafe"

// NewStream creates a stream (cuStreamCreate, CU_STREAM_DEFAULT): it
// synchronises with the legacy default stream, so the synchronous copies of
// Buffer order after the kernels queued on it.
func (c *Ctx) NewStream() (Stream, error) {
	s := new(uintptr)
	if err := c.call("cuStreamCreate", uintptr(unsafe.Pointer(s)), 0); err != nil {
		return 0, err
	}
	return Stream(*s), nil
}

// DestroyStream destroys a stream made by NewStream.
func (c *Ctx) DestroyStream(s Stream) error {
	if s == 0 {
		return nil
	}
	return c.call("cuStreamDestroy_v2", uintptr(s))
}

// SyncStream waits for the work queued on s.
func (c *Ctx) SyncStream(s Stream) error { return c.call("cuStreamSynchronize", uintptr(s)) }

// Event is a CUevent for ordering and timing.
type Event uintptr

// NewEvent creates an event with timing enabled (CU_EVENT_DEFAULT).
func (c *Ctx) NewEvent() (Event, error) {
	e := new(uintptr)
	if err := c.call("cuEventCreate", uintptr(unsafe.Pointer(e)), 0); err != nil {
		return 0, err
	}
	return Event(*e), nil
}

// DestroyEvent destroys an event.
func (c *Ctx) DestroyEvent(e Event) error {
	if e == 0 {
		return nil
	}
	return c.call("cuEventDestroy_v2", uintptr(e))
}

// Record records e on stream s.
func (c *Ctx) Record(e Event, s Stream) error { return c.call("cuEventRecord", uintptr(e), uintptr(s)) }

// SyncEvent waits until e has completed.
func (c *Ctx) SyncEvent(e Event) error { return c.call("cuEventSynchronize", uintptr(e)) }

// Elapsed returns the milliseconds between two completed events.
func (c *Ctx) Elapsed(start, end Event) (float32, error) {
	ms := new(float32)
	err := c.call("cuEventElapsedTime", uintptr(unsafe.Pointer(ms)), uintptr(start), uintptr(end))
	return *ms, err
}
