//go:build !race

package kvindex

// raceBuild: see race_on_test.go.
const raceBuild = false
