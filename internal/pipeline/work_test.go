package pipeline_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
)

// Wait returns at once when nothing is under way, and
// otherwise when the last piece of work ends, work added meanwhile
// included.
func TestWork(t *testing.T) {
	var b pipeline.Work
	b.Wait()
	b.Add()
	waited := make(chan struct{})
	go func() { b.Wait(); close(waited) }()
	b.Add() // while Wait may be waiting
	b.Done()
	select {
	case <-waited:
		t.Fatal("Wait returned with work under way")
	case <-time.After(20 * time.Millisecond):
	}
	b.Done()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once the work ended")
	}
	b.Add()
	b.Done()
	b.Wait()
}
