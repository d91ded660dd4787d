package nexus

import (
	"context"
	"encoding/base64"
	"unicode/utf8"
)

// MaxBufferedOutput bounds the output ExecBuffered holds in memory; the
// rest is read and dropped, and the result says it was.
const MaxBufferedOutput = 16 << 20

// ExecResult is a command's whole answer for a program: the CLI's
// `--json exec` and the HTTP API's exec?format=json print the same.
type ExecResult struct {
	// Output is stdout and stderr as the command wrote them: the text
	// when it is UTF-8 (Encoding "utf-8"), else its base64 ("base64").
	Output   string `json:"output"`
	Encoding string `json:"encoding"`
	Exit     int    `json:"exit"`
	// Truncated: the command printed more than MaxBufferedOutput bytes
	// and Output holds the first MaxBufferedOutput.
	Truncated bool `json:"truncated,omitempty"`
}

// ExecBuffered runs a command as Exec does and returns its output whole.
func (n *Nexus) ExecBuffered(ctx context.Context, ref, command string) (ExecResult, error) {
	var buf capBuffer
	code, err := n.Exec(ctx, ref, command, &buf)
	if err != nil {
		return ExecResult{}, err
	}
	r := ExecResult{Output: string(buf.b), Encoding: "utf-8", Exit: code, Truncated: buf.truncated}
	if !utf8.Valid(buf.b) {
		r.Output, r.Encoding = base64.StdEncoding.EncodeToString(buf.b), "base64"
	}
	return r, nil
}

// capBuffer keeps the first MaxBufferedOutput bytes written to it and
// takes (and drops) the rest, so the command's reply is still read to its
// end.
type capBuffer struct {
	b         []byte
	truncated bool
}

func (c *capBuffer) Write(p []byte) (int, error) {
	room := MaxBufferedOutput - len(c.b)
	if len(p) > room {
		c.truncated = true
		c.b = append(c.b, p[:max(room, 0)]...)
		return len(p), nil
	}
	c.b = append(c.b, p...)
	return len(p), nil
}
