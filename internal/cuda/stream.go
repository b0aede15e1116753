package cuda

import "unsafe"

// NewStream creates a stream (cuStreamCreate, CU_STREAM_DEFAULT): it
// synchronises with the legacy default stream, so the synchronous copies of
// Buffer order after the kernels queued on it.
func (c *Ctx) NewStream() (Stream, error) {
	s, err := c.create("cuStreamCreate")
	return Stream(s), err
}

// DestroyStream destroys a stream made by NewStream.
func (c *Ctx) DestroyStream(s Stream) error { return c.destroy("cuStreamDestroy_v2", uintptr(s)) }

// SyncStream waits for the work queued on s.
func (c *Ctx) SyncStream(s Stream) error { return c.call("cuStreamSynchronize", uintptr(s)) }

// Event is a CUevent for ordering and timing.
type Event uintptr

// NewEvent creates an event with timing enabled (CU_EVENT_DEFAULT).
func (c *Ctx) NewEvent() (Event, error) {
	e, err := c.create("cuEventCreate")
	return Event(e), err
}

// DestroyEvent destroys an event.
func (c *Ctx) DestroyEvent(e Event) error { return c.destroy("cuEventDestroy_v2", uintptr(e)) }

// create makes a stream or an event: fn takes the handle's address and
// flags 0 (the default kind). The handle is 0 on error.
func (c *Ctx) create(fn string) (uintptr, error) {
	h := new(uintptr)
	if err := c.call(fn, uintptr(unsafe.Pointer(h)), 0); err != nil {
		return 0, err
	}
	return *h, nil
}

// destroy destroys a stream or an event with fn; 0 is none.
func (c *Ctx) destroy(fn string, h uintptr) error {
	if h == 0 {
		return nil
	}
	return c.call(fn, h)
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

// Time records an event on stream s, calls fn to queue the work to time,
// records a second event, waits for it and returns the milliseconds between
// the two. It makes the two events and destroys them.
func (c *Ctx) Time(s Stream, fn func() error) (float32, error) {
	start, err := c.NewEvent()
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(start)
	end, err := c.NewEvent()
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(end)
	if err := c.Record(start, s); err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	if err := c.Record(end, s); err != nil {
		return 0, err
	}
	if err := c.SyncEvent(end); err != nil {
		return 0, err
	}
	return c.Elapsed(start, end)
}
