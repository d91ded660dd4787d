package conf

import "errors"

// CheckSandboxID is nether.conf's sandbox_id rule for identities that
// arrive another way (a __claim__): nil when v is usable, else why not.
// It is the rule the sandbox_id key applies, not a copy of it, so an id
// a claim hands in is held to exactly what nether.conf accepts.
func CheckSandboxID(v string) error { return problem(checkSandboxID(v)) }

// CheckHostname is nether.conf's hostname rule (one DNS label), for the
// same reason as CheckSandboxID.
func CheckHostname(v string) error { return problem(checkHostname(v)) }

func problem(msg string) error {
	if msg == "" {
		return nil
	}
	return errors.New(msg)
}
