package libvirt

import (
	"encoding/binary"
	"slices"
	"testing"
)

// TestRPCFramerFollowsPacketsCutAnywhere: the watchdog sees every
// packet's header however the stream is cut into reads and writes.
func TestRPCFramerFollowsPacketsCutAnywhere(t *testing.T) {
	packet := func(typ, serial uint32, payload int) []byte {
		b := make([]byte, rpcHeaderSize+payload)
		be := binary.BigEndian
		be.PutUint32(b[0:4], uint32(len(b)))
		be.PutUint32(b[4:8], remoteProgram)
		be.PutUint32(b[12:16], 7)
		be.PutUint32(b[16:20], typ)
		be.PutUint32(b[20:24], serial)
		for i := rpcHeaderSize; i < len(b); i++ {
			b[i] = 0xff // a payload that would read as a header if miscounted
		}
		return b
	}
	stream := slices.Concat(packet(rpcCall, 1, 0), packet(rpcReply, 2, 100), packet(2, 3, 5), packet(rpcData, 4, 4096))
	want := []rpcHeader{{remoteProgram, 7, rpcCall, 1, 0}, {remoteProgram, 7, rpcReply, 2, 0}, {remoteProgram, 7, 2, 3, 0}, {remoteProgram, 7, rpcData, 4, 0}}
	for _, size := range []int{1, 3, 27, 28, 29, 100, len(stream)} {
		var f rpcFramer
		var got []rpcHeader
		for b := stream; len(b) > 0; {
			k := min(size, len(b))
			f.feed(b[:k], func(h rpcHeader) { got = append(got, h) })
			b = b[k:]
		}
		if !slices.Equal(got, want) {
			t.Errorf("cut every %d bytes: headers %+v, want %+v", size, got, want)
		}
	}
}
