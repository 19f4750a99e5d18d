package flowcontrol

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// interleavingStore is a MemStore that runs between once, the first time a
// read of key finds nothing, before that read returns: another VM's work
// in the window between this VM's read and its next write.
type interleavingStore struct {
	*MemStore
	key     string
	between func()
}

func (s *interleavingStore) Get(key string, buf []byte) ([]byte, uint32, error) {
	v, cas, err := s.MemStore.Get(key, buf)
	if key == s.key && errors.Is(err, ErrNotFound) && s.between != nil {
		f := s.between
		s.between = nil
		f()
	}
	return v, cas, err
}

// Two VMs find no record; the second creates it and admits a request
// before the first creates it too. Creating the record must not wipe
// that admission: the first VM must see it, or both fill the same slot.
func TestCreatingTheRecordKeepsAnotherVMsAdmission(t *testing.T) {
	const key = "admitted"
	mem := &MemStore{}
	store := &interleavingStore{MemStore: mem, key: key}
	base := fleetSnapshot(2, 0)
	snapA, snapB := copyOf(base), copyOf(base)
	a, b := NewAdmission(store, key), NewAdmission(mem, key)
	store.between = func() {
		require.NoError(t, b.Sync(snapB, 7))
		require.NoError(t, b.Admit(snapB, 7, 1))
	}
	require.NoError(t, a.Sync(snapA, 7))
	require.Equal(t, []int{0, 1}, waiting(snapA), "the first VM counts the second VM's admission")
	require.NoError(t, b.Sync(snapB, 7))
	require.Equal(t, []int{0, 1}, waiting(snapB), "the record still holds it")
}
