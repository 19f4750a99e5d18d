package envoyhost

import (
	"sync"
)

// sharedData is the process-wide shared-data table of cpp-host
// src/shared_data.cc: one map per vm_id, one CAS counter for everything,
// starting at 1 and skipping 0. There is no delete call in the ABI.
type sharedData struct {
	mu   sync.Mutex
	cas  uint32
	data map[string]map[string]sharedEntry
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

func newSharedData() *sharedData {
	return &sharedData{cas: 1, data: map[string]map[string]sharedEntry{}}
}

func (s *sharedData) nextCas() uint32 {
	c := s.cas
	s.cas++
	if s.cas == 0 { // 0 is not a valid CAS value.
		s.cas++
	}
	return c
}

// get returns a copy of the value and its cas, or NotFound.
func (s *sharedData) get(vmID, key string) ([]byte, uint32, WasmResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.data[vmID]
	if !ok {
		return nil, 0, ResultNotFound
	}
	e, ok := m[key]
	if !ok {
		return nil, 0, ResultNotFound
	}
	return append([]byte(nil), e.value...), e.cas, ResultOK
}

// set stores value: cas 0 or a new key always succeeds, a non-zero cas that
// differs from the stored one is CasMismatch.
func (s *sharedData) set(vmID, key string, value []byte, cas uint32) WasmResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.data[vmID]
	if !ok {
		m = map[string]sharedEntry{}
		s.data[vmID] = m
	}
	if e, ok := m[key]; ok && cas != 0 && cas != e.cas {
		return ResultCasMismatch
	}
	m[key] = sharedEntry{value: append([]byte(nil), value...), cas: s.nextCas()}
	return ResultOK
}

// sharedQueues emulates cpp-host src/shared_queue.cc: named queues per
// vm_id, tokens from a global counter, on_queue_ready delivered to the root
// context that registered the queue, on the VM that owns it.
type sharedQueues struct {
	mu        sync.Mutex
	nextToken uint32
	byName    map[string]uint32 // vm_id + "\x00" + name -> token
	queues    map[uint32]*sharedQueue
}

type sharedQueue struct {
	vm            *VM
	rootContextID uint32
	items         [][]byte
}

func newSharedQueues() *sharedQueues {
	return &sharedQueues{nextToken: 1, byName: map[string]uint32{}, queues: map[uint32]*sharedQueue{}}
}

func (q *sharedQueues) register(vmID, name string, vm *VM, rootID uint32) uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := vmID + "\x00" + name
	if tok, ok := q.byName[key]; ok {
		// Re-registration moves the queue to the caller, as cpp-host does.
		q.queues[tok].vm = vm
		q.queues[tok].rootContextID = rootID
		return tok
	}
	tok := q.nextToken
	q.nextToken++
	q.byName[key] = tok
	q.queues[tok] = &sharedQueue{vm: vm, rootContextID: rootID}
	return tok
}

func (q *sharedQueues) resolve(vmID, name string) uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.byName[vmID+"\x00"+name]
}

func (q *sharedQueues) dequeue(token uint32) ([]byte, WasmResult) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, ok := q.queues[token]
	if !ok {
		return nil, ResultNotFound
	}
	if len(sq.items) == 0 {
		return nil, ResultEmpty
	}
	v := sq.items[0]
	sq.items = sq.items[1:]
	return v, ResultOK
}

func (q *sharedQueues) enqueue(token uint32, value []byte) (*VM, uint32, WasmResult) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, ok := q.queues[token]
	if !ok {
		return nil, 0, ResultNotFound
	}
	sq.items = append(sq.items, append([]byte(nil), value...))
	return sq.vm, sq.rootContextID, ResultOK
}

// queueReady delivers on_queue_ready to the root context that registered
// the queue.
func (vm *VM) queueReady(rootID, token uint32) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	root := vm.contexts[rootID]
	if root == nil || !vm.has("proxy_on_queue_ready") {
		return
	}
	vm.callback(root, "proxy_on_queue_ready", uint64(rootID), uint64(token))
}
