package pipeline

// QueuedOnMasters returns the number of calls waiting for a pipeline in
// the batchers of a cluster's masters (Queued counts those outside a
// cluster).
func QueuedOnMasters(r *Runner) int {
	n := 0
	r.nodes.Range(func(_, b any) bool {
		bt := b.(*batcher)
		bt.mu.Lock()
		n += len(bt.queue)
		bt.mu.Unlock()
		return true
	})
	return n
}
