package checkpoint

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// willNeed starts the kernel reading spans of r's file into the page cache
// (POSIX_FADV_WILLNEED: it queues the reads and returns). A reader that is
// not a file, or advice refused, costs nothing but the call.
func willNeed(r io.ReaderAt, spans [][2]int64) {
	f, ok := r.(*os.File)
	if !ok {
		return
	}
	sc, err := f.SyscallConn() // the descriptor, its mode untouched (Fd would make it blocking)
	if err != nil {
		return
	}
	sc.Control(func(fd uintptr) {
		for _, s := range spans {
			if unix.Fadvise(int(fd), s[0], s[1]-s[0], unix.FADV_WILLNEED) != nil {
				return
			}
		}
	})
}
