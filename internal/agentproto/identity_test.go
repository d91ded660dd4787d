package agentproto

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestReadSecrets(t *testing.T) {
	good := Secrets{"API_KEY": []byte("\x00\xffvalue"), "db.pass": []byte("")}
	back, err := ReadSecrets(bytes.NewReader(EncodeSecrets(good)))
	if err != nil || !reflect.DeepEqual(back, good) {
		t.Fatalf("round trip: %q, %v", back, err)
	}
	many := Secrets{}
	for i := 0; i <= MaxSecrets; i++ {
		many[strings.Repeat("k", i+1)] = []byte("v")
	}
	for _, tt := range []struct {
		name, in, want string
	}{
		{"not json", "API_KEY=x", "not a JSON object"},
		{"not base64", `{"A":"not base64!"}`, "not a JSON object"},
		{"climbs out", `{"a/../../x":""}`, `holds '/'`},
		{"hidden", `{".x":""}`, "starts with '.'"},
		{"empty name", `{"":""}`, "cannot be empty"},
		{"too many", string(EncodeSecrets(many)), "at most 32"},
		{"too large", string(EncodeSecrets(Secrets{"A": []byte(strings.Repeat("x", MaxSecretBytes+1))})), "at most 16384 together"},
		{"huge", strings.Repeat(" ", maxSecretsEncoding+1), "encoded"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadSecrets(strings.NewReader(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadSecrets = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestIdentityCheckAndDecode(t *testing.T) {
	ok := Request{Op: OpProvision, Identity: &Identity{BootID: "b", Token: "a.b"}, Secrets: Secrets{"K": []byte("v")}}
	if _, err := Decode(ok.Encode()); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		req  Request
		want string
	}{
		{"newline in a field", Request{Op: OpRestored, Identity: &Identity{BootID: "b\nroot=1"}}, "byte 0x0a"},
		{"overlong token", Request{Op: OpProvision, Identity: &Identity{Token: strings.Repeat("t", MaxIdentityField+1)}}, "at most 2048"},
		{"bad secret name", Request{Op: OpRestored, Secrets: Secrets{"a/b": []byte("")}}, "holds '/'"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode(tt.req.Encode()); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Decode = %v, want %q", err, tt.want)
			}
		})
	}
}
