package coord

// WaitFrees waits for the frees left running behind requests (freeLater),
// so that a test sees their outcome.
func (c *Coordinator) WaitFrees() { c.bg.Wait() }
