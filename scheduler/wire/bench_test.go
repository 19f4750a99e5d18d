package wire

import (
	"fmt"
	"testing"
)

func BenchmarkDecodePush(b *testing.B) {
	for _, n := range []int{64, 512} {
		buf, err := EncodePush(push("node-a", 1, n), Limits{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := DecodePush(buf, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncodePush(b *testing.B) {
	for _, n := range []int{64, 512} {
		p := push("node-a", 1, n)
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var dst []byte
			for b.Loop() {
				var err error
				if dst, err = AppendPush(dst[:0], p, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
