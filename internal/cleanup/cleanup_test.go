package cleanup

import (
	"slices"
	"testing"
)

func TestCleanup(t *testing.T) {
	tests := []struct {
		name string
		// build adds to c, recording into ran, and returns what the
		// test calls at the end (the deferred Clean of a caller).
		build func(c *Cleanup, ran *[]int) func()
		want  []int
	}{
		{
			name:  "empty clean does nothing",
			build: func(c *Cleanup, ran *[]int) func() { return func() {} },
		},
		{
			name: "clean runs last-added first",
			build: func(c *Cleanup, ran *[]int) func() {
				for i := 1; i <= 3; i++ {
					c.Add(func() { *ran = append(*ran, i) })
				}
				return func() {}
			},
			want: []int{3, 2, 1},
		},
		{
			name: "release keeps everything",
			build: func(c *Cleanup, ran *[]int) func() {
				c.Add(func() { *ran = append(*ran, 1) })
				c.Add(func() { *ran = append(*ran, 2) })
				c.Release()
				return func() {}
			},
		},
		{
			name: "release hands the undoing on",
			build: func(c *Cleanup, ran *[]int) func() {
				c.Add(func() { *ran = append(*ran, 1) })
				c.Add(func() { *ran = append(*ran, 2) })
				return c.Release()
			},
			want: []int{2, 1},
		},
		{
			name: "added after a release runs on clean",
			build: func(c *Cleanup, ran *[]int) func() {
				c.Add(func() { *ran = append(*ran, 1) })
				c.Release()
				c.Add(func() { *ran = append(*ran, 2) })
				return func() {}
			},
			want: []int{2},
		},
		{
			name: "a second clean does nothing",
			build: func(c *Cleanup, ran *[]int) func() {
				c.Add(func() { *ran = append(*ran, 1) })
				c.Clean()
				return func() {}
			},
			want: []int{1},
		},
		{
			name: "make holds its function",
			build: func(c *Cleanup, ran *[]int) func() {
				*c = Make(func() { *ran = append(*ran, 7) })
				c.Add(func() { *ran = append(*ran, 8) })
				return func() {}
			},
			want: []int{8, 7},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ran []int
			var c Cleanup
			after := tt.build(&c, &ran)
			c.Clean()
			after()
			if !slices.Equal(ran, tt.want) {
				t.Fatalf("ran %v, want %v", ran, tt.want)
			}
		})
	}
}
