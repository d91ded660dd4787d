package main

import (
	"reflect"
	"testing"
)

// TestAboutDevice: of the kernel's log, a disk problem quotes the last
// messages about its device, without their record prefix or dictionary,
// and nothing about another device.
func TestAboutDevice(t *testing.T) {
	log := []string{
		"6,310,1631000,-;virtio_blk virtio2: [vdb] 131072 512-byte logical blocks (67.1 MB/64.0 MiB)\n",
		"3,311,2221004,-;EXT4-fs error (device vdb): ext4_get_journal_inode:5769: inode #8: comm init: iget: bad extra_isize 44510 (inode size 256)\n SUBSYSTEM=block\n DEVICE=b254:16\n",
		"3,312,2227560,-;EXT4-fs (vdb): no journal found\n",
		"3,313,2227561,-;EXT4-fs (vdba): another device\n",
		"3,314,2227562,-;I/O error, dev vdb, sector 2 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2\n",
		"3,315,2227563,-;I/O error, dev vda, sector 2\n",
		"not a record",
	}
	tests := []struct {
		name string
		max  int
		want []string
	}{
		{"all of them", 10, []string{
			"EXT4-fs error (device vdb): ext4_get_journal_inode:5769: inode #8: comm init: iget: bad extra_isize 44510 (inode size 256)",
			"EXT4-fs (vdb): no journal found",
			"I/O error, dev vdb, sector 2 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2",
		}},
		{"the last two", 2, []string{
			"EXT4-fs (vdb): no journal found",
			"I/O error, dev vdb, sector 2 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := aboutDevice(log, "vdb", tc.max); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("aboutDevice = %q\nwant %q", got, tc.want)
			}
		})
	}
	if got := aboutDevice(log, "vdc", 3); got != nil {
		t.Errorf("messages about another device: %q", got)
	}
}
