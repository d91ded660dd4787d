package screen

import (
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/ansi/parser"
	"github.com/charmbracelet/x/vt"
)

// maxParam bounds every numeric parameter of a CSI sequence. The parser
// keeps parameters up to 2^31-1, and some of the emulator's handlers do
// work in proportion to one: ESC[2147483647X erases that many cells one
// by one, outside the screen as well as in it, for seconds, while the
// console pump waits. No legitimate parameter is larger (mode numbers stop
// below 10000; positions and counts are bounded by the screen).
const maxParam = 9999

// perColumn are the CSI commands whose parameters only make sense up to
// the width of the screen and that misbehave past it: REP (repeat the last
// character n times, one by one: clamped to a line's worth, a 6-byte
// sequence costs at most a line of printing), CHT and CBT (move n tab
// stops), ECH (erase n cells) and DECSLRM (left and right margins: the
// emulator takes margins past the edge and then indexes outside its
// rows).
var perColumn = []byte{'b', 'I', 'Z', 'X', 's'}

// perRow are those bounded by the height: DECSTBM (top and bottom
// margins; ESC[1;99r on a 24-row screen followed by an insert-line
// panics the emulator).
var perRow = []byte{'r'}

// clampParams puts handlers in front of the emulator's own CSI handlers
// that lower oversized parameters in place: vt calls the handlers of a
// command newest first, with the same parameters, until one returns true,
// and these return false. (DECSTBM reads its second parameter from the
// parser rather than from the handler's argument; it is the same array.)
func clampParams(emu *vt.Emulator) {
	for final := byte('@'); final <= '~'; final++ {
		for _, prefix := range []byte{0, '?', '>', '<', '='} {
			emu.RegisterCsiHandler(ansi.Command(prefix, 0, final), func(params ansi.Params) bool {
				clamp(params, maxParam)
				return false
			})
		}
	}
	for _, final := range perColumn {
		emu.RegisterCsiHandler(int(final), func(params ansi.Params) bool {
			clamp(params, emu.Width())
			return false
		})
	}
	for _, final := range perRow {
		emu.RegisterCsiHandler(int(final), func(params ansi.Params) bool {
			clamp(params, emu.Height())
			return false
		})
	}
}

// clamp lowers every parameter above limit to limit, keeping the flag
// that marks a sub-parameter.
func clamp(params ansi.Params, limit int) {
	for i, p := range params {
		if p.Param(-1) > limit {
			v := ansi.Param(limit)
			if p.HasMore() {
				v |= parser.HasMoreFlag
			}
			params[i] = v
		}
	}
}
