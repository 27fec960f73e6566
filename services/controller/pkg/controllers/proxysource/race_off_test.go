//go:build !race

package proxysource

const raceEnabled = false
