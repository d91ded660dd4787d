// Package cleanup undoes a half-finished setup in one place. A function
// that acquires things one after another adds, after each, what gives it
// back; every failing return then needs nothing of its own, and the one
// that succeeds keeps everything by releasing the list:
//
//	var cu cleanup.Cleanup
//	defer cu.Clean()
//	f, err := open()
//	if err != nil {
//		return err
//	}
//	cu.Add(func() { f.Close() })
//	...
//	cu.Release() // success: f stays open
//
// It is modelled on gVisor's pkg/cleanup.
package cleanup

// Cleanup is a list of undo functions, run last-added first. The zero
// value is an empty list, ready to use. It is not safe for concurrent use:
// it belongs to the one function that builds something.
type Cleanup struct {
	undo []func()
}

// Make returns a Cleanup holding f.
func Make(f func()) Cleanup {
	return Cleanup{undo: []func(){f}}
}

// Add puts f on the list; it runs before everything added earlier.
func (c *Cleanup) Add(f func()) {
	c.undo = append(c.undo, f)
}

// Clean runs the list, last-added first, and empties it: a second Clean,
// or one after Release, does nothing.
func (c *Cleanup) Clean() {
	undo := c.undo
	c.undo = nil
	for i := len(undo) - 1; i >= 0; i-- {
		undo[i]()
	}
}

// Release empties the list without running it (what was set up is kept)
// and returns what would have run, for a caller that hands the undoing
// on to someone else; most callers ignore it.
func (c *Cleanup) Release() func() {
	undo := c.undo
	c.undo = nil
	return func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
}
