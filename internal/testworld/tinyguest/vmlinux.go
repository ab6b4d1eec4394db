package tinyguest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/pierrec/lz4/v4"
)

// lz4LegacyMagic starts an LZ4 stream in the legacy format ("lz4 -l"),
// which the kernel's build uses for an LZ4-compressed bzImage.
const lz4LegacyMagic = 0x184C2102

// lz4LegacyBlock is the most a legacy LZ4 block decompresses to.
const lz4LegacyBlock = 8 << 20

// extractVmlinux returns the uncompressed ELF kernel inside an
// LZ4-compressed bzImage. QEMU boots that ELF through its PVH entry point
// (the kernel has CONFIG_PVH) without running the decompressor, which
// under TCG costs about a CPU-second per boot.
//
// The bzImage's setup header (Documentation/x86/boot.rst) gives the
// payload's place: payload_offset (0x248) and payload_length (0x24c),
// counted from the protected-mode code, which follows the
// (setup_sects+1) 512-byte setup sectors. The payload ends with the
// uncompressed size, little-endian.
func extractVmlinux(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage (no HdrS setup header)")
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(bz[0x248:]))
	length := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if length < 8 || start+length > len(bz) {
		return nil, fmt.Errorf("bzImage payload at %d+%d is outside the file (%d bytes)", start, length, len(bz))
	}
	payload := bz[start : start+length]
	size := int(binary.LittleEndian.Uint32(payload[len(payload)-4:]))
	if binary.LittleEndian.Uint32(payload) != lz4LegacyMagic {
		return nil, fmt.Errorf("the bzImage payload is not LZ4 (magic %#x): only LZ4 kernels are unpacked", binary.LittleEndian.Uint32(payload))
	}
	out, err := unlz4Legacy(payload[4:len(payload)-4], size)
	if err != nil {
		return nil, err
	}
	if _, err := elf.NewFile(bytes.NewReader(out)); err != nil {
		return nil, fmt.Errorf("the unpacked kernel is not ELF: %w", err)
	}
	return out, nil
}

// unlz4Legacy decompresses legacy-format LZ4 blocks (each a little-endian
// compressed length and the block) until size bytes are out.
func unlz4Legacy(in []byte, size int) ([]byte, error) {
	out := make([]byte, 0, size)
	block := make([]byte, lz4LegacyBlock)
	for len(out) < size {
		if len(in) < 4 {
			return nil, fmt.Errorf("LZ4 stream ends at %d of %d bytes", len(out), size)
		}
		n := int(binary.LittleEndian.Uint32(in))
		if n == lz4LegacyMagic { // a concatenated stream
			in = in[4:]
			continue
		}
		if n > len(in)-4 {
			return nil, fmt.Errorf("LZ4 block of %d bytes past the end", n)
		}
		got, err := lz4.UncompressBlock(in[4:4+n], block)
		if err != nil {
			return nil, fmt.Errorf("LZ4 block: %w", err)
		}
		out = append(out, block[:got]...)
		in = in[4+n:]
	}
	return out, nil
}
