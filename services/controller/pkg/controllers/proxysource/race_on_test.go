//go:build race

package proxysource

// raceEnabled: the race detector's shadow memory roughly doubles a
// process's resident set, which bounds on it allow for.
const raceEnabled = true
