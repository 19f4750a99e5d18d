package vllmsim

// requestDeque is a FIFO of requests that also accepts pushes at the front
// (preempted requests go back first). It is a ring buffer: no allocation in
// steady state.
type requestDeque struct {
	buf  []*Request
	head int
	n    int
}

func (q *requestDeque) len() int { return q.n }

func (q *requestDeque) front() *Request { return q.buf[q.head] }

func (q *requestDeque) grow() {
	size := max(8, 2*len(q.buf))
	buf := make([]*Request, size)
	for i := 0; i < q.n; i++ {
		buf[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = buf, 0
}

func (q *requestDeque) pushBack(r *Request) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)%len(q.buf)] = r
	q.n++
}

func (q *requestDeque) pushFront(r *Request) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = r
	q.n++
}

func (q *requestDeque) popFront() *Request {
	r := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return r
}

// remove deletes r, keeping the order of the others; O(n), for aborts.
func (q *requestDeque) remove(r *Request) bool {
	for i := 0; i < q.n; i++ {
		if q.buf[(q.head+i)%len(q.buf)] != r {
			continue
		}
		for j := i; j < q.n-1; j++ {
			q.buf[(q.head+j)%len(q.buf)] = q.buf[(q.head+j+1)%len(q.buf)]
		}
		q.buf[(q.head+q.n-1)%len(q.buf)] = nil
		q.n--
		return true
	}
	return false
}
