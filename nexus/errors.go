package nexus

import (
	"errors"
	"fmt"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/nexus/store"
)

// The kinds of failure a caller can act on. The CLI maps them to exit
// codes and the HTTP API to statuses and its "kind" field, from this one
// classification, so both surfaces always agree on what an error is.
const (
	KindIllegal   = "illegal_transition" // the lifecycle table does not allow the verb in the sandbox's state
	KindNotFound  = "not_found"          // no such sandbox or snapshot
	KindBusy      = "busy"               // another operation holds the record
	KindNameTaken = "name_taken"         // the name belongs to another record
	KindBadInput  = "bad_request"        // the request itself is malformed; nothing was touched
	KindInUse     = "in_use"             // a snapshot that sandboxes or a warm pool still depend on
	KindRefused   = "refused"            // admission refused it (no plan, or a plan that does not allow it), or the guest did (permission denied)
	KindTooLarge  = "too_large"          // a file over the sandbox's max_transfer_bytes
	KindInternal  = "internal"           // anything else: a guest that did not come up, a damaged store, ...
)

// ErrInvalid marks a request nexus refuses before touching anything (a
// bad name, settings nether would refuse, a pool size out of range).
var ErrInvalid = errors.New("invalid request")

// Kind classifies err as one of the Kind* constants ("" for nil).
func Kind(err error) string {
	switch {
	case err == nil:
		return ""
	case IsIllegal(err):
		return KindIllegal
	case errors.Is(err, store.ErrNotFound):
		return KindNotFound
	case errors.Is(err, ErrBusy):
		return KindBusy
	case errors.Is(err, store.ErrNameTaken):
		return KindNameTaken
	case errors.Is(err, ErrInUse):
		return KindInUse
	case errors.Is(err, ErrRefused):
		return KindRefused
	case errors.Is(err, ErrTooLarge):
		return KindTooLarge
	case errors.Is(err, ErrInvalid), errors.Is(err, store.ErrAmbiguous), errors.Is(err, client.ErrInvalidCommand):
		return KindBadInput
	}
	return KindInternal
}

// The validators below let a caller that takes requests from outside (the
// HTTP API) tell a malformed request from a failed operation: Create,
// Fork, SnapshotCreate and PoolSet run the same checks, but their errors
// do not say which kind they are. Each wraps ErrInvalid.

// ValidateCreate checks a create request's name and settings.
func ValidateCreate(req CreateRequest) error {
	if err := checkName(req.Name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := checkConfig(req.Config); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// ValidateFork checks a fork request's count and names.
func ValidateFork(req ForkRequest) error {
	if req.N < 0 {
		return fmt.Errorf("%w: n is %d; want 1 or more (0 means 1)", ErrInvalid, req.N)
	}
	n := max(req.N, 1)
	if _, err := childNames(req.Names, n); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if req.RunAs != "" {
		if err := checkConfig(Config{RunAs: req.RunAs}); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return nil
}

// ValidateSnapshotName checks a snapshot's optional name.
func ValidateSnapshotName(name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// MaxPoolSize is the largest warm pool PoolSet accepts.
const MaxPoolSize = 256

// ValidatePoolSize checks a pool size (PoolSet refuses the same range).
func ValidatePoolSize(size int) error {
	if size < 0 || size > MaxPoolSize {
		return fmt.Errorf("%w: pool size %d: want 0 to %d", ErrInvalid, size, MaxPoolSize)
	}
	return nil
}
