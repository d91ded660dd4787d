//go:build nether_unobserved

package main

// unobserved is true only in the build bench/observe makes to measure
// what the event timeline and the command log cost a command's round trip.
const unobserved = true
