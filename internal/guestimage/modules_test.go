package guestimage

import (
	"slices"
	"strings"
	"testing"
)

// A small modules.dep in depmod's format: each line lists the module's full
// dependency closure. virtio_console's list is deliberately in "wrong" order
// to show the resolver doesn't rely on depmod's ordering convention.
const testModulesDep = `kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/hw_random/virtio-rng.ko.xz: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/net/core/failover.ko:
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/broken.ko: kernel/drivers/absent.ko
`

const testModulesBuiltin = `kernel/drivers/virt/vmgenid.ko
kernel/drivers/block/virtio_blk.ko
`

func TestResolve(t *testing.T) {
	ix, err := ParseModuleIndex(strings.NewReader(testModulesDep), strings.NewReader(testModulesBuiltin))
	if err != nil {
		t.Fatal(err)
	}
	const (
		virtio  = "kernel/drivers/virtio/virtio.ko"
		ring    = "kernel/drivers/virtio/virtio_ring.ko"
		modern  = "kernel/drivers/virtio/virtio_pci_modern_dev.ko"
		pci     = "kernel/drivers/virtio/virtio_pci.ko"
		console = "kernel/drivers/char/virtio_console.ko"
		rng     = "kernel/drivers/char/hw_random/virtio-rng.ko.xz"
		fo      = "kernel/net/core/failover.ko"
		netfo   = "kernel/drivers/net/net_failover.ko"
		vnet    = "kernel/drivers/net/virtio_net.ko"
	)
	tests := []struct {
		name        string
		roots       []string
		want        []string
		wantBuiltin []string
		wantErr     string
	}{
		{name: "leaf", roots: []string{"virtio"}, want: []string{virtio}},
		{name: "deps first", roots: []string{"virtio_net"}, want: []string{fo, netfo, ring, virtio, vnet}},
		{name: "order independent of dep list order", roots: []string{"virtio_console"}, want: []string{virtio, ring, console}},
		{name: "dedupe across roots", roots: []string{"virtio_pci", "virtio_console", "virtio_pci"},
			want: []string{modern, ring, virtio, pci, console}},
		{name: "dash name given, file has dash", roots: []string{"virtio-rng"}, want: []string{ring, virtio, rng}},
		{name: "underscore name given, file has dash", roots: []string{"virtio_rng"}, want: []string{ring, virtio, rng}},
		{name: "dash name given, file has underscore", roots: []string{"virtio-net"}, want: []string{fo, netfo, ring, virtio, vnet}},
		{name: "builtin skipped", roots: []string{"vmgenid", "virtio-blk", "virtio", "vmgenid"},
			want: []string{virtio}, wantBuiltin: []string{"vmgenid", "virtio_blk"}},
		{name: "missing root", roots: []string{"virtio", "no_such_mod"}, wantErr: "no_such_mod is neither in modules.dep nor in modules.builtin"},
		{name: "missing dependency", roots: []string{"broken"}, wantErr: "absent (needed by broken)"},
		{name: "empty", roots: nil, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, builtin, err := ix.Resolve(tc.roots)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("paths = %q\nwant    %q", got, tc.want)
			}
			if !slices.Equal(builtin, tc.wantBuiltin) {
				t.Errorf("builtin = %q, want %q", builtin, tc.wantBuiltin)
			}
		})
	}
}

func TestResolveCycle(t *testing.T) {
	ix, err := ParseModuleIndex(strings.NewReader("a.ko: b.ko\nb.ko: a.ko\n"), strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ix.Resolve([]string{"a"}); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("err = %v, want cycle error", err)
	}
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"virtio-rng":                       "virtio_rng",
		"kernel/drivers/net/virtio_net.ko": "virtio_net",
		"kernel/x/virtio-rng.ko.xz":        "virtio_rng",
		"kernel/x/a-b.ko.zst":              "a_b",
		"/lib/modules/6.1/kernel/x/foo.ko": "foo",
	} {
		t.Run(in, func(t *testing.T) {
			if got := ModuleName(in); got != want {
				t.Errorf("ModuleName(%q) = %q, want %q", in, got, want)
			}
		})
	}
}
