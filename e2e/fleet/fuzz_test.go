package fleet

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseCriticalityMix: any input either fails or yields a valid mix
// that survives a round trip through its String form.
func FuzzParseCriticalityMix(f *testing.F) {
	for _, s := range []string{"critical=1", "critical=0.6,standard=0.2,sheddable=0.2", "sheddable=1e3", "critical=0", "=", "critical=NaN", "critical=Inf,standard=1", ",,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseCriticalityMix(s)
		if err != nil {
			return
		}
		require.NoError(t, m.Validate())
		again, err := ParseCriticalityMix(m.String())
		require.NoError(t, err)
		require.Equal(t, m, again)
		for _, u := range []float64{0, 0.5, 0.999999} {
			c := m.pick(u)
			require.True(t, c >= 0 && c <= 2)
		}
	})
}
