package ring

import (
	"slices"
	"testing"
)

func TestRing(t *testing.T) {
	for _, tc := range []struct {
		name        string
		capacity    int
		add         int
		want        []int
		wantDropped uint64
	}{
		{"empty", 3, 0, []int{}, 0},
		{"not full", 3, 2, []int{0, 1}, 0},
		{"full", 3, 3, []int{0, 1, 2}, 0},
		{"wrapped", 3, 7, []int{4, 5, 6}, 4},
		{"capacity below one is one", 0, 2, []int{1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New[int](tc.capacity)
			for i := range tc.add {
				r.Add(i)
			}
			got, dropped := r.Entries()
			if !slices.Equal(got, tc.want) || dropped != tc.wantDropped {
				t.Fatalf("Entries() = %v, %d; want %v, %d", got, dropped, tc.want, tc.wantDropped)
			}
		})
	}
}

func TestAppendHeader(t *testing.T) {
	for _, tc := range []struct {
		head    string
		count   int
		dropped uint64
		want    string
	}{
		{"CMDLOG", 0, 0, "CMDLOG 0\n"},
		{"NETLOG", 3, 0, "NETLOG 3\n"},
		{"EVENTS 57", 2, 9, "EVENTS 57 2 dropped=9\n"},
	} {
		if got := string(AppendHeader([]byte("x"), tc.head, tc.count, tc.dropped)); got != "x"+tc.want {
			t.Errorf("AppendHeader(%q, %d, %d) = %q, want %q", tc.head, tc.count, tc.dropped, got, "x"+tc.want)
		}
	}
}
