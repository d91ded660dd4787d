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

// CheckNodeID and CheckBootID are the node_id and boot_id rules, for a
// boot identity a __claim__ hands in.
func CheckNodeID(v string) error { return problem(checkPrintable(v, "node id", MaxSandboxID)) }
func CheckBootID(v string) error { return problem(checkPrintable(v, "boot id", MaxSandboxID)) }

// CheckPlanDigest is the plan_digest rule.
func CheckPlanDigest(v string) error { return problem(checkDigest(v)) }

// CheckIdentityToken is the identity_token rule.
func CheckIdentityToken(v string) error {
	return problem(checkPrintable(v, "identity token", MaxIdentityToken))
}
