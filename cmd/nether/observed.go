//go:build !nether_unobserved

package main

// unobserved is false in every nether a user runs: the event timeline and
// the command log are on.
const unobserved = false
