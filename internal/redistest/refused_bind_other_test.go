//go:build !unix

package redistest

// bindExclusive is not needed where HoldPort holds nothing.
func bindExclusive(string) error { return nil }
