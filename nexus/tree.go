package nexus

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/nethersandbox/nether/nexus/store"
)

// Node is one sandbox or snapshot in the lineage: a sandbox's children
// are the snapshots taken of it; a snapshot's are the sandboxes forked
// from it.
type Node struct {
	Kind     string  `json:"kind"` // "sandbox" or "snapshot"
	ID       string  `json:"id"`
	Name     string  `json:"name,omitempty"`
	State    string  `json:"state,omitempty"` // a sandbox's
	Pool     bool    `json:"pool,omitempty"`  // a warm pool member
	Children []*Node `json:"children,omitempty"`
}

// Label is how the tree prints the node.
func (nd *Node) Label() string {
	id := nd.ID
	if len(id) > 16 {
		id = id[:16]
	}
	var b strings.Builder
	if nd.Kind == "snapshot" {
		b.WriteString("snapshot ")
	}
	if nd.Name != "" {
		fmt.Fprintf(&b, "%s (%s)", nd.Name, id)
	} else {
		b.WriteString(id)
	}
	if nd.State != "" {
		b.WriteString(" " + nd.State)
	}
	if nd.Pool {
		b.WriteString(" [pool]")
	}
	return b.String()
}

// Tree returns the lineage: of ref (a sandbox or snapshot) and what
// descends from it, or, with ref "", every root (sandboxes that were
// created, not forked, and snapshots whose source is gone).
func (n *Nexus) Tree(ctx context.Context, ref string) ([]*Node, error) {
	var sbs []*store.Sandbox
	var snaps []*store.Snapshot
	var root *Node
	err := n.db.View(func(tx *store.Tx) error {
		var err error
		if sbs, err = tx.Sandboxes(); err != nil {
			return err
		}
		if snaps, err = tx.Snapshots(); err != nil {
			return err
		}
		if ref == "" {
			return nil
		}
		if s, err := tx.FindSnapshot(ref); err == nil {
			root = &Node{Kind: "snapshot", ID: s.ID}
			return nil
		}
		b, err := tx.FindSandbox(ref)
		if err != nil {
			return fmt.Errorf("%w: no sandbox or snapshot %q", store.ErrNotFound, ref)
		}
		root = &Node{Kind: "sandbox", ID: b.ID}
		return nil
	})
	if err != nil {
		return nil, err
	}
	nodes := map[string]*Node{}
	for _, sb := range sbs {
		if sb.Lease != nil && sb.Lease.Op == opBirth {
			continue
		}
		nodes[sb.ID] = &Node{Kind: "sandbox", ID: sb.ID, Name: sb.Name, State: string(sb.State), Pool: sb.Pool != ""}
	}
	for _, s := range snaps {
		if s.Digest != "" {
			nodes[s.ID] = &Node{Kind: "snapshot", ID: s.ID, Name: s.Name}
		}
	}
	hasParent := map[string]bool{}
	link := func(parent, child string) {
		p, c := nodes[parent], nodes[child]
		if p == nil || c == nil {
			return
		}
		p.Children = append(p.Children, c)
		hasParent[child] = true
	}
	for _, s := range snaps {
		link(s.Source, s.ID)
	}
	for _, sb := range sbs {
		if sb.Snapshot != "" {
			link(sb.Snapshot, sb.ID)
		} else if sb.Parent != "" {
			link(sb.Parent, sb.ID)
		}
	}
	for _, nd := range nodes {
		sort.Slice(nd.Children, func(i, j int) bool { return nd.Children[i].ID < nd.Children[j].ID })
	}
	if root != nil {
		return []*Node{nodes[root.ID]}, nil
	}
	roots := []*Node{} // empty, not nil: JSON []
	for id, nd := range nodes {
		if !hasParent[id] {
			roots = append(roots, nd)
		}
	}
	sort.Slice(roots, func(i, j int) bool { return roots[i].ID < roots[j].ID })
	return roots, nil
}

// WriteTree draws roots with box-drawing lines.
func WriteTree(w io.Writer, roots []*Node) {
	var walk func(nd *Node, prefix string, last bool, top bool)
	walk = func(nd *Node, prefix string, last bool, top bool) {
		branch, next := "├── ", "│   "
		if last {
			branch, next = "└── ", "    "
		}
		if top {
			branch, next = "", ""
		}
		fmt.Fprintf(w, "%s%s%s\n", prefix, branch, nd.Label())
		for i, c := range nd.Children {
			walk(c, prefix+next, i == len(nd.Children)-1, false)
		}
	}
	for _, r := range roots {
		walk(r, "", true, true)
	}
}

// WriteDot writes roots as a Graphviz digraph.
func WriteDot(w io.Writer, roots []*Node) {
	fmt.Fprintln(w, "digraph lineage {")
	fmt.Fprintln(w, "  rankdir=LR;")
	seen := map[string]bool{}
	var walk func(nd *Node)
	walk = func(nd *Node) {
		if seen[nd.ID] {
			return
		}
		seen[nd.ID] = true
		shape := "box"
		if nd.Kind == "snapshot" {
			shape = "cylinder"
		}
		fmt.Fprintf(w, "  %q [label=%q shape=%s];\n", nd.ID, nd.Label(), shape)
		for _, c := range nd.Children {
			fmt.Fprintf(w, "  %q -> %q;\n", nd.ID, c.ID)
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	fmt.Fprintln(w, "}")
}
