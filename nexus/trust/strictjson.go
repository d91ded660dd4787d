package trust

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// maxJSONDepth bounds the nesting checkDuplicateKeys walks: a plan is a
// few levels deep, and a hostile document must not cost a deep stack.
const maxJSONDepth = 32

// checkDuplicateKeys refuses a JSON document in which an object names a
// key twice, exactly or in another case. Readers disagree on such a
// document (Go's decoder keeps the last value and matches field names
// without regard to case, others keep the first or fail), so a signed plan
// that holds one could mean one plan to nexus and another to anyone who
// audits it. Refusing it leaves every reader the same plan.
func checkDuplicateKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := walkValue(dec, "", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON document")
	}
	return nil
}

// walkValue reads one value from dec, checking every object in it; path
// names where it is, for the error ("limits.ram_mb").
func walkValue(dec *json.Decoder, path string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if depth >= maxJSONDepth {
		return fmt.Errorf("JSON nested more than %d levels deep", maxJSONDepth)
	}
	switch d {
	case '{':
		seen := map[string]string{} // folded key -> the key as written
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("malformed JSON: %w", err)
			}
			key, _ := tok.(string)
			at := key
			if path != "" {
				at = path + "." + key
			}
			folded := strings.ToLower(key)
			if first, dup := seen[folded]; dup {
				if first == key {
					return fmt.Errorf("the key %q appears twice", at)
				}
				return fmt.Errorf("the keys %q and %q differ only in case", first, key)
			}
			seen[folded] = key
			if err := walkValue(dec, at, depth+1); err != nil {
				return err
			}
		}
	case '[':
		for i := 0; dec.More(); i++ {
			if err := walkValue(dec, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return fmt.Errorf("malformed JSON: %w", err)
	}
	return nil
}
